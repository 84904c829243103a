"""Serving strategies (§2.4, §3.5): collocated ``xm`` and disaggregated ``ypzd`` with TP sizes
and a maximum batch size -- plus, beyond BestServe, our scheduling policies on ``xm``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sloserve.perf.hardware import Hardware
from sloserve.perf.models import ModelShape
from sloserve.policies import BASELINE, instance_roles, policy_names

COLLOCATED = "collocated"
DISAGGREGATED = "disaggregated"
DISAGG = "disagg"  # the policy name of BestServe's disaggregated simulator (not a registry one)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of device memory for weights + KV


@dataclass(frozen=True, slots=True)
class Strategy:
    """One serving strategy. Disaggregated: ``instances`` prefill (``y``) and
    ``decode_instances`` decode (``z``) instances of ``tp`` devices each."""

    architecture: str
    instances: int
    tp: int
    max_batch_size: int
    decode_instances: int = 0
    policy: str = BASELINE
    token_budget: int | None = None  # sarathi / accelgen chunk budget
    hp_instances: int = 0  # ascendra: how many of ``instances`` are HP

    def __post_init__(self) -> None:
        if self.architecture not in (COLLOCATED, DISAGGREGATED):
            raise ValueError(f"architecture: must be {COLLOCATED!r} or {DISAGGREGATED!r}, "
                             f"got {self.architecture!r}")
        if self.instances < 1 or self.tp < 1 or self.max_batch_size < 1:
            raise ValueError("strategy: instances, tp and max_batch_size must be >= 1")
        if (self.architecture == DISAGGREGATED) != (self.decode_instances >= 1):
            raise ValueError("decode_instances: >= 1 exactly for a disaggregated strategy")
        if self.architecture == DISAGGREGATED and self.policy != DISAGG:
            raise ValueError(f"policy: a disaggregated strategy runs the {DISAGG!r} simulator")
        if self.architecture == COLLOCATED:
            if self.policy not in policy_names():
                raise ValueError(f"policy: must be one of {policy_names()}, got {self.policy!r}")
            instance_roles(self.policy, self.instances, self.hp_instances)
        elif self.hp_instances:
            raise ValueError("hp_instances: a disaggregated strategy has none")

    @property
    def gpus(self) -> int:
        return (self.instances + self.decode_instances) * self.tp

    @property
    def name(self) -> str:
        """``4m-tp2``, ``2p3d-tp1``; a non-vLLM policy is appended (``4m-tp2-sarathi512``)."""
        if self.architecture == DISAGGREGATED:
            return f"{self.instances}p{self.decode_instances}d-tp{self.tp}"
        base = f"{self.instances}m-tp{self.tp}"
        if self.policy == BASELINE:
            return base
        suffix = self.policy + (str(self.token_budget) if self.token_budget else "")
        if self.hp_instances:
            suffix += f"-{self.hp_instances}hp"
        return f"{base}-{suffix}"


def kv_slots(model: ModelShape, hw: Hardware, tp: int, context: int) -> int:
    """Requests of ``context`` tokens whose KV fits next to the weights on ``tp`` devices
    (BestServe is memory-insensitive, §5; we are not). 0: the weights do not fit."""
    free = GPU_MEMORY_UTILIZATION * hw.mem_bytes * tp - model.weight_bytes
    if free <= 0:
        return 0
    return int(free // (model.kv_bytes_per_token * max(context, 1)))


def tp_sizes_for(model: ModelShape, gpus: int, tp_sizes: Iterable[int]) -> list[int]:
    """Admissible TP sizes: within the budget and dividing the attention heads."""
    return [t for t in sorted(set(tp_sizes)) if 1 <= t <= gpus and model.num_heads % t == 0]


def enumerate_strategies(model: ModelShape, hw: Hardware, gpus: int, context: int,
                         tp_sizes: Iterable[int] = (1, 2, 4, 8),
                         max_batch_sizes: Iterable[int] = (32,),
                         architectures: Iterable[str] = (COLLOCATED, DISAGGREGATED),
                         ) -> list[Strategy]:
    """Every ``xm`` and ``ypzd`` (same TP on both sides) within ``gpus`` devices whose
    weights and at least one request's KV (``context`` tokens) fit (§3.5)."""
    if gpus < 1:
        raise ValueError(f"gpus: must be >= 1, got {gpus}")
    archs = set(architectures)
    out: list[Strategy] = []
    for t in tp_sizes_for(model, gpus, tp_sizes):
        if kv_slots(model, hw, t, context) < 1:
            continue
        n = gpus // t
        for b in sorted(set(max_batch_sizes)):
            if COLLOCATED in archs:
                out += [Strategy(COLLOCATED, m, t, b) for m in range(1, n + 1)]
            if DISAGGREGATED in archs:
                out += [Strategy(DISAGGREGATED, y, t, b, decode_instances=z, policy=DISAGG)
                        for y in range(1, n) for z in range(1, n - y + 1)]
    return out
