"""Simulation configuration (a slotted dataclass, nano-vllm style)."""

from __future__ import annotations

from dataclasses import dataclass

from sloserve.perf.base import TimingSource
from sloserve.policies.base import PolicyConfig

STRICT_TBT_SLO = 0.25  # seconds; below this Sarathi's strict budget (512) is the default


@dataclass(slots=True)
class SimConfig:
    policy: str
    model: str = "llama-3-8b"
    gpu: str = "a100"
    instances: int = 1
    hp_instances: int = 0
    trace: str | None = "sharegpt"
    trace_file: str | None = None
    fixed_lengths: tuple[int, int] | None = None  # (prompt_len, output_len) for every request
    qps: float = 1.0
    num_requests: int = 1000
    ttft_slo: float | None = 1.0
    tbt_slo: float | None = 0.15
    slo_mix: str | None = None
    arrival: str = "poisson"  # poisson | gamma | trace
    cv: float = 1.0  # gamma arrivals' coefficient of variation
    seed: int = 0
    tp: int = 1
    block_size: int = 16
    num_blocks: int | None = None  # KV capacity; default from GPU memory
    noise_cv: float = 0.03  # run-to-run noise of the ground truth
    policy_config: PolicyConfig | None = None
    max_num_seqs: int | None = None  # None: policy default (Ascendra LP: 128, §6.2)
    token_budget: int | None = None  # None: 512 for a strict TBT SLO, 2048 for a relaxed one
    timing: TimingSource | None = None  # ground-truth override (e.g. a measured CPU profile)
    timing_profile: str | None = None  # file of measured samples (``sloserve profile --out``)
    record_samples: bool = False  # keep every (shape, duration) for offline analysis
    record_decisions: bool = False  # keep the controller's actions and every plan (tests)
    perf_model: str = "online"  # "roofline": policies see the uncalibrated roofline, never refit

    def validate(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances: must be >= 1, got {self.instances}")
        if not 0 <= self.hp_instances < self.instances:
            raise ValueError(
                f"hp_instances: must be in [0, instances), got {self.hp_instances} "
                f"with {self.instances} instances"
            )
        if self.hp_instances and self.policy != "ascendra":
            # Ascendra with no HP runs LP-only (offloading off); other policies have no HP role
            raise ValueError("hp_instances: only the ascendra policy has HP instances")
        if not self.qps > 0:
            raise ValueError(f"qps: must be > 0, got {self.qps}")
        if self.num_requests < 1:
            raise ValueError(f"num_requests: must be >= 1, got {self.num_requests}")
        sources = [self.trace is not None, self.trace_file is not None,
                   self.fixed_lengths is not None]
        if sum(sources) != 1:
            raise ValueError("trace: give exactly one of trace, trace_file, fixed_lengths")
        if self.perf_model not in ("online", "roofline"):
            raise ValueError(f"perf_model: must be 'online' or 'roofline', got {self.perf_model!r}")
        if self.noise_cv < 0:
            raise ValueError(f"noise_cv: must be >= 0, got {self.noise_cv}")

    def default_token_budget(self) -> int:
        """Sarathi-Serve §5: 512 under a strict TBT SLO, 2048 under a relaxed one."""
        if self.token_budget is not None:
            return self.token_budget
        if self.tbt_slo is None or self.slo_mix is not None:
            return 512
        return 512 if self.tbt_slo < STRICT_TBT_SLO else 2048
