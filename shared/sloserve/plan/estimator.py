"""BestServe's Estimator (§3.3, Appendices A and B): operator tables, adapted roofline, Algorithm 1.

Every operator of a LLaMa block gets a work ``W`` (FLOP) and a memory traffic
``Q`` (bytes) from the paper's tables; its time is ``W / P`` with the adapted
roofline ``P = min(I, I*) * e_m * S_m`` (eq. 5), ``I = W / Q`` and
``I* = (e_c / e_m) * (S_c / S_m)`` (eq. 4) -- i.e. ``max(W / (e_c S_c), Q / (e_m S_m))``.
Modules are accumulated per block by Algorithm 1 (dispatch-bound versus
compute-bound), TP adds the all-reduce of eq. 8 after attention and MLP.

Where the printed tables contradict themselves we follow the reading that
makes Appendix B equal Appendix A at ``t = 1`` (docs/bestserve.md lists each):
decode ``mul`` traffic is ``6 b h0`` (Tables 2/13 print ``6 b s h0``, an ``s``
that cannot occur in decode); Table 11's ``update``/``repeat_kv`` use Table 9's
factor 4 divided by ``t``; Table 11's ``K_PROJ`` work is divided by ``t`` like
``V_PROJ``'s; decode ``softmax`` work is divided by ``t`` like its traffic.

The tables are written for ``b`` sequences of length ``s``. To time any
``BatchShape`` (chunked prefills over cached context, mixed batches) the token
count ``n = b s`` drives every linear/norm term and the attention-score terms
take ``S2 = sum(c (c + p))`` over prefill chunks (``= b s^2`` for whole
prompts) and ``L = sum(context)`` over decodes (``= b s``); for the paper's
uniform batches the two forms are identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from sloserve.batch import BatchShape
from sloserve.perf.hardware import Hardware
from sloserve.perf.models import ModelShape

PHASES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class Efficiency:
    """MFU ``e_c``, MBU ``e_m`` and communication efficiency ``e_+`` of one phase (§4.1)."""

    e_c: float
    e_m: float
    e_plus: float

    def __post_init__(self) -> None:
        for name in ("e_c", "e_m", "e_plus"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"{name}: efficiency must be in (0, 1], got {v}")


@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """BestServe's tunables, defaulting to the paper's values.

    Efficiencies: §4.1. Dispatch times per module: Table 3 (Ascend 910B3,
    seconds). ``allreduce_floor``: Table 3 lists 0.100 ms of communication for
    both the prefill (eq. 8 gives 0.078 ms there) and the decode example, which
    only a per-call floor explains; eq. 8 alone is ``allreduce_floor = 0``.
    ``kappa_*`` (eq. 12, bytes/s) are not given by the paper: ``None`` means
    the phase's memory rate ``e_m * S_m``.
    """

    prefill: Efficiency = field(default_factory=lambda: Efficiency(0.65, 0.6, 0.6))
    decode: Efficiency = field(default_factory=lambda: Efficiency(0.65, 0.3, 0.3))
    dispatch_rmsnorm: float = 0.024e-3
    dispatch_attention: float = 0.190e-3
    dispatch_mlp: float = 0.041e-3
    allreduce_floor: float = 0.100e-3
    kappa_update: float | None = None
    kappa_kv: float | None = None
    kappa_upcast: float | None = None

    def __post_init__(self) -> None:
        for name in ("dispatch_rmsnorm", "dispatch_attention", "dispatch_mlp", "allreduce_floor"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0 seconds, got {getattr(self, name)}")
        for name in ("kappa_update", "kappa_kv", "kappa_upcast"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"{name}: must be > 0 bytes/s, got {v}")

    def efficiency(self, phase: str) -> Efficiency:
        if phase not in PHASES:
            raise ValueError(f"phase: must be 'prefill' or 'decode', got {phase!r}")
        return self.prefill if phase == "prefill" else self.decode


@dataclass(frozen=True, slots=True)
class Op:
    """One operator: work ``W`` (FLOP), traffic ``Q`` (bytes). ``kappa`` names an eq.-12
    rate for the pure data-movement ops that have no work (``W`` is ``None``)."""

    name: str
    work: float | None
    traffic: float
    kappa: str | None = None


def rmsnorm_ops(n: float, h: int) -> tuple[Op, ...]:
    """Tables 6/7 (prefill with ``n = b s``, decode with ``n = b``); not split by TP (B.1)."""
    return (
        Op("pow", n * h, 4 * n * h),
        Op("mean", n * h, 2 * n * h + 2 * n),
        Op("add", n, 4 * n),
        Op("rsqrt", n, 4 * n),
        Op("mul", n * h, 4 * n * h + 2 * n),
        Op("mul_weight", n * h, 4 * n * h + 2 * h),
    )


def attention_prefill_ops(m: ModelShape, n: float, s2: float, t: int) -> tuple[Op, ...]:
    """Tables 8/10: ``n`` prefill tokens, ``s2`` attention-score elements per head."""
    h, hq, r = m.hidden_size, m.num_heads, m.num_kv_heads / m.num_heads
    return (
        Op("q_proj", 2 * n * h * h / t, 2 * (2 * n * h + h * h) / t),
        Op("k_proj", 2 * n * h * h * r / t, 2 * (n * h + h * h * r / t + n * h * r / t)),
        Op("v_proj", 2 * n * h * h * r / t, 2 * (n * h + h * h * r / t + n * h * r / t)),
        Op("rope", 3.5 * n * h * (1 + r), 2 * n * h * (8.5 + 8.5 * r + 2 / hq)),
        Op("qk_t", 2 * s2 * h / t, 2 * (2 * n * h + hq * s2) / t),
        Op("div", hq * s2 / t, 4 * hq * s2 / t),
        Op("mask_add", hq * s2 / t, 2 * (2 * hq * s2 / t + s2)),
        Op("softmax", 3 * hq * s2 / t, 4 * hq * s2 / t),
        Op("at_v", 2 * s2 * h / t, 2 * (hq * s2 + 2 * n * h) / t),
        Op("o_proj", 2 * n * h * h / t, 2 * (n * h + n * h / t + h * h)),
    )


def attention_decode_ops(m: ModelShape, b: float, ctx: float, t: int) -> tuple[Op, ...]:
    """Tables 9/11: ``b`` decodes over ``ctx = sum of their contexts`` (``= b s``)."""
    h, hq, r = m.hidden_size, m.num_heads, m.num_kv_heads / m.num_heads
    ops = [
        Op("q_proj", 2 * b * h * h / t, 2 * (2 * b * h + h * h) / t),
        Op("k_proj", 2 * b * h * h * r / t, 2 * (b * h + h * h * r / t + b * h * r / t)),
        Op("v_proj", 2 * b * h * h * r / t, 2 * (b * h + h * h * r / t + b * h * r / t)),
        Op("rope", 3.5 * b * h * (1 + r), 2 * b * h * (8.5 + 8.5 * r + 2 / hq)),
        Op("update", None, 4 * ctx * h * r / t, "kappa_update"),
    ]
    if m.num_kv_heads < m.num_heads:  # Is_GQA in eq. 12
        ops.append(Op("repeat_kv", None, 4 * ctx * h * (1 + r) / t, "kappa_kv"))
    ops += [
        Op("qk_t", 2 * ctx * h / t, 2 * (b * h + ctx * h + hq * ctx) / t),
        Op("div", hq * ctx / t, 4 * hq * ctx / t),
        Op("mask_add", hq * ctx / t, 2 * (2 * hq * ctx / t + ctx)),
        Op("upcast", None, 4 * hq * ctx / t, "kappa_upcast"),
        Op("softmax", 3 * hq * ctx / t, 4 * hq * ctx / t),
        Op("at_v", 2 * ctx * h / t, 2 * (b * h + ctx * h + hq * ctx) / t),
        Op("o_proj", 2 * b * h * h / t, 2 * (b * h + h * h / t + b * h / t)),
    ]
    return tuple(ops)


def mlp_ops(m: ModelShape, n: float, t: int) -> tuple[Op, ...]:
    """Tables 1/2/12/13 with ``n`` tokens (``b s`` in prefill, ``b`` in decode)."""
    h, h0 = m.hidden_size, m.intermediate_size
    proj = (2 * n * h * h0 / t, 2 * (n * (h + h0) + h * h0) / t)
    return (
        Op("gate_proj", *proj),
        Op("silu", 5 * n * h0 / t, 4 * n * h0 / t),
        Op("up_proj", *proj),
        Op("mul", n * h0 / t, 6 * n * h0 / t),
        Op("down_proj", *proj),
        Op("add", n * h / t, 4 * n * h0 / t),
    )


def op_time(op: Op, hw: Hardware, eff: Efficiency, cfg: EstimatorConfig) -> float:
    """``W / P`` with ``P = min(I, I*) e_m S_m`` (eq. 5); ``Q / kappa`` for eq.-12 ops."""
    if op.work is None:
        assert op.kappa is not None
        rate = getattr(cfg, op.kappa) or eff.e_m * hw.mem_bandwidth
        return op.traffic / rate
    if op.work <= 0:
        return 0.0
    intensity = op.work / op.traffic
    critical = (eff.e_c / eff.e_m) * (hw.peak_flops / hw.mem_bandwidth)
    return op.work / (min(intensity, critical) * eff.e_m * hw.mem_bandwidth)


def allreduce_time(n: float, h: int, t: int, hw: Hardware, eff: Efficiency,
                   cfg: EstimatorConfig) -> float:
    """Eq. 8: ``T_+ = (b s h / t) / (e_+ S_+)`` (``n = b s``), at least ``allreduce_floor``."""
    if t <= 1:
        return 0.0
    return max(cfg.allreduce_floor, (n * h / t) / (eff.e_plus * hw.interconnect_bw))


@dataclass(frozen=True, slots=True)
class ModuleTime:
    """One row of Table 3: a module's dispatch, compute and communication time (s)."""

    name: str
    dispatch: float
    compute: float
    communicate: float


def accumulate(modules: tuple[ModuleTime, ...], num_layers: int) -> float:
    """Algorithm 1: CPU dispatch runs ahead of the GPU; a module starts when both its
    dispatch is done and the previous module's compute is. Per block, times ``num_layers``.

    (Line 15 of the printed algorithm sits inside the module loop, which would
    count earlier modules again for every later one; we add the block once.)
    """
    t_dispatch = t_compute = 0.0
    for mod in modules:
        t_dispatch += mod.dispatch
        if t_dispatch > t_compute:  # dispatch-bound: the GPU waited for the CPU
            t_compute = t_dispatch + mod.compute
        else:  # compute-bound: the op was queued before the GPU got to it
            t_compute += mod.compute
        t_compute += mod.communicate
    return num_layers * t_compute


class Estimator:
    """Processing time of a batch on one instance of ``tp`` devices (§3.3)."""

    def __init__(self, model: ModelShape, hw: Hardware, tp: int = 1,
                 config: EstimatorConfig | None = None) -> None:
        if tp < 1:
            raise ValueError(f"tp: must be >= 1, got {tp}")
        if model.num_heads % tp or model.num_kv_heads % tp and tp % model.num_kv_heads:
            raise ValueError(f"tp: {tp} does not divide {model.name}'s {model.num_heads} heads")
        self.model, self.hw, self.tp = model, hw, tp
        self.config = config or EstimatorConfig()
        self._cached = lru_cache(maxsize=65536)(self._estimate_time)  # §3.3.4
        self._decode_step = lru_cache(maxsize=65536)(self._decode_step_time)

    def _time(self, ops: tuple[Op, ...], eff: Efficiency) -> float:
        return sum(op_time(op, self.hw, eff, self.config) for op in ops)

    def modules(self, phase: str, n: float, s2: float = 0.0, b: float = 0.0,
                ctx: float = 0.0) -> tuple[ModuleTime, ...]:
        """Table 3's rows for ``n`` new tokens: ``s2`` prefill score elements per head and
        ``b`` decodes over ``ctx`` summed context (both may be present in a mixed batch)."""
        m, cfg, t = self.model, self.config, self.tp
        eff = cfg.efficiency(phase)
        attn_ops: tuple[Op, ...] = ()
        if n - b > 0:
            attn_ops += attention_prefill_ops(m, n - b, s2, t)
        if b > 0:
            attn_ops += attention_decode_ops(m, b, ctx, t)
        norm_time = self._time(rmsnorm_ops(n, m.hidden_size), eff)
        norm = ModuleTime("rmsnorm", cfg.dispatch_rmsnorm, norm_time, 0.0)
        comm = allreduce_time(n, m.hidden_size, t, self.hw, eff, cfg)
        return (
            norm,
            ModuleTime("attention", cfg.dispatch_attention, self._time(attn_ops, eff), comm),
            norm,
            ModuleTime("mlp", cfg.dispatch_mlp, self._time(mlp_ops(m, n, t), eff), comm),
        )

    def estimate_time(self, b: int, s: int, s_plus: int, phase: str) -> float:
        """Algorithm 1, cached by its arguments (§3.3.4)."""
        return float(self._cached(b, s, s_plus, phase))

    def _estimate_time(self, b: int, s: int, s_plus: int, phase: str) -> float:
        """Algorithm 1 for ``b`` requests of length ``s + s_plus`` (cached by arguments).

        Prefill: one pass over the whole prompts; decode: one step of ``b`` decodes
        each over ``s + s_plus`` cached tokens (Table 3b: ``s + s_+ = 2048 + 63``).
        """
        if b < 1 or s + s_plus < 1:
            raise ValueError(f"batch: need b >= 1 and s + s_plus >= 1, got b={b} s={s} "
                             f"s_plus={s_plus}")
        length = s + s_plus
        if phase == "prefill":
            mods = self.modules("prefill", b * length, s2=b * length * length)
        else:
            mods = self.modules("decode", b, b=b, ctx=b * length)
        return accumulate(mods, self.model.num_layers)

    def batch_time(self, shape: BatchShape) -> float:
        """Algorithm 1 for an arbitrary (chunked, mixed) batch; prefill efficiencies
        when any prefill chunk is present, decode ones otherwise."""
        if shape.is_empty:
            return 0.0
        if not shape.prefills:  # a pure decode step depends on (b, summed context) only
            return float(self._decode_step(len(shape.decodes), sum(shape.decodes)))
        s2 = float(sum(c * (c + p) for c, p in shape.prefills))
        mods = self.modules(
            "prefill" if shape.prefills else "decode",
            float(shape.num_tokens), s2=s2, b=float(len(shape.decodes)),
            ctx=float(sum(shape.decodes)),
        )
        return accumulate(mods, self.model.num_layers)

    def _decode_step_time(self, b: int, ctx: int) -> float:
        mods = self.modules("decode", float(b), b=float(b), ctx=float(ctx))
        return accumulate(mods, self.model.num_layers)


@dataclass(slots=True)
class BestServeTiming:
    """A ``TimingSource`` (``sloserve.perf.base``) backed by the Estimator: ground truth
    for the per-iteration simulator when a model/GPU has no real profile."""

    estimator: Estimator

    def batch_time(self, shape: BatchShape) -> float:
        return self.estimator.batch_time(shape)
