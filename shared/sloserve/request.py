"""Requests, SLOs and their lifecycle (nano-vllm's ``Sequence``, with SLOs).

Token accounting follows vLLM: a request holds ``num_tokens = prompt_len +
num_generated`` tokens of which ``num_computed`` have KV in cache. A chunk of
``n`` tokens advances ``num_computed``; when it reaches ``num_tokens`` one new
token is sampled. A decode is the case ``num_uncomputed == 1``. Preemption by
recompute resets ``num_computed`` to 0 (generated tokens are recomputed too).

Priority polarity: **higher ``priority`` = more urgent**.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto


class RequestStatus(Enum):
    WAITING = auto()  # queued on an instance, holds no KV
    RUNNING = auto()  # holds KV blocks: prefilling (maybe chunked) or decoding
    FINISHED = auto()
    DROPPED = auto()  # rejected under overload (Ascendra §6.3); counts as an SLO miss
    OFFLOADED = auto()  # handed to another instance; terminal on the instance that offloaded
    CANCELLED = auto()


TERMINAL = frozenset(
    {RequestStatus.FINISHED, RequestStatus.DROPPED, RequestStatus.CANCELLED}
)


@dataclass(slots=True)
class SLO:
    """Per-request targets in seconds; ``None`` means no target of that kind."""

    ttft: float | None = None
    tbt: float | None = None
    jct: float | None = None
    # the targets a deployment filled in (its defaults), not the request's own (issue 35):
    # they are scored and order the queue, but a request is never shed for one it did not ask
    defaulted: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in ("ttft", "tbt", "jct"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}_slo: must be > 0 seconds, got {value!r}")
        for name in self.defaulted:
            if name not in ("ttft", "tbt", "jct") or getattr(self, name) is None:
                raise ValueError(f"defaulted: {name!r} is not a target this SLO sets "
                                 "(ttft, tbt or jct)")

    def own(self, name: str) -> float | None:
        """The request's own ``name`` target (``ttft``, ``tbt``, ``jct``); ``None`` if it
        has none or it is the deployment's default."""
        value: float | None = getattr(self, name)
        return None if name in self.defaulted else value


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    arrival_time: float
    prompt_len: int
    output_len: int  # max new tokens; the sim backend generates exactly this many
    slo: SLO = field(default_factory=SLO)
    priority: int = 0  # higher = more urgent
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0
    num_generated: int = 0
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    num_preemptions: int = 0
    num_offloads: int = 0
    origin_instance: str | None = None  # the instance that first received it
    drop_reason: str | None = None  # set when a policy drops it with a reason of its own
    # the generated token ids, in the live stack (None in simulation: lengths only)
    output_token_ids: list[int] | None = None
    # prefix identity (Mooncake ``hash_ids``): one content id per PREFIX_UNIT (512) tokens of
    # the request's token stream; None = no identity, so nothing is shared (sloserve.kv_prefix)
    hash_ids: tuple[int, ...] | None = None
    hash_unit: int = 512  # tokens per hash id (Mooncake: 512; live token ids: the block size)
    # prompt tokens found in the prefix cache when last looked up / admitted (vLLM
    # ``num_cached_tokens``); they count in ``num_computed`` without being computed
    num_cached: int = 0

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len: must be >= 1, got {self.prompt_len}")
        if self.output_len < 1:
            raise ValueError(f"output_len (max_tokens): must be >= 1, got {self.output_len}")
        if self.hash_unit < 1:
            raise ValueError(f"hash_unit: must be >= 1 tokens per hash id, got {self.hash_unit}")

    # --- progress -------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_generated

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def in_prefill(self) -> bool:
        """True until the (re)computed prompt has produced its next token."""
        return self.num_generated == 0 or self.num_uncomputed > 1

    def samples_after(self, num_tokens: int) -> bool:
        """Whether a chunk of ``num_tokens`` from here completes the sequence (a token is due)."""
        return self.num_computed + num_tokens >= self.num_tokens

    @property
    def is_decode(self) -> bool:
        return not self.in_prefill

    @property
    def prefill_started(self) -> bool:
        """Whether a chunk of its own was computed (a prefix-cache hit alone is not a start)."""
        return self.num_computed > self.num_cached

    @property
    def remaining_output(self) -> int:
        return self.output_len - self.num_generated

    @property
    def is_finished(self) -> bool:
        return self.status in TERMINAL

    # --- SLO bookkeeping ---------------------------------------------------
    @property
    def ttft_deadline(self) -> float | None:
        return None if self.slo.ttft is None else self.arrival_time + self.slo.ttft

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def ttft(self) -> float | None:
        t = self.first_token_time
        return None if t is None else t - self.arrival_time

    @property
    def tbt_gaps(self) -> list[float]:
        tt = self.token_times
        return [b - a for a, b in zip(tt, tt[1:])]

    @property
    def mean_tbt(self) -> float | None:
        tt = self.token_times
        return None if len(tt) < 2 else (tt[-1] - tt[0]) / (len(tt) - 1)
