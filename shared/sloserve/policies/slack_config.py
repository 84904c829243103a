"""``slack``'s knobs (``SlackConfig``): what each one does and why its default is what it
is are in docs/lab/beyond.md, "Our policy" (knob defaults). Two former knobs that no grid
run moved from their defaults (issue 32) are constants: ``slack.SMITH_MARGIN`` and
``slack_stall.ALONE_MARGIN``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sloserve.defaults import TBT_SLO
from sloserve.policies.base import PolicyConfig, knob

LATE_MODES = ("triage", "defer", "drop", "serve")
ORDERS = ("smith", "edf", "latest-start")
LATE_BOUNDS = ("idle", "always", "off")


@dataclass(frozen=True, slots=True)
class SlackConfig(PolicyConfig):
    """The slack policy's knobs."""

    max_num_batched_tokens: int = knob(
        8192, "slack: tokens per iteration when no decode is tight (vLLM's cap)", min=1)
    tbt_margin: float = knob(
        0.8, "slack: share of the tightest TBT slack one iteration may take (perf-model error)",
        min=0.05, max=1.0)
    min_prefill_tokens: int = knob(
        32, "slack: prefill tokens an iteration may always take, so prompts never starve", min=0)
    late: str = knob(
        "triage", "slack: what happens to a waiting request that can no longer meet its "
        "TTFT, or that Moore-Hodgson gives up: 'triage' drops it if the load made it late "
        "(given up for others, or late while others wait) and defers it otherwise; "
        "'defer' serves every such request from a background queue (shortest prompt "
        "first) with what on-time work leaves; 'drop' ends every one with a reason; "
        "'serve' gives up nothing", choices=LATE_MODES)
    drop_budget: float = knob(
        0.01, "slack: the most 'triage' may drop, as a share of the requests this instance "
        "has been given so far; a request it would drop past that is deferred instead, so a "
        "burst cannot buy goodput with refusals over the tail criterion's bound "
        "(--max-drop-share, 1 %; issue 38); 1: no bound (triage before issue 38)",
        min=0.0, max=1.0)
    order: str = knob(
        "smith", "slack: waiting order: 'smith' (deadline order, then short first where "
        "every kept deadline allows: Smith's rule), 'edf' (deadline order), 'latest-start' "
        "(deadline - predicted prefill; the order before Smith's rule)", choices=ORDERS)
    late_chunk: int = knob(
        512, "slack: most prompt tokens the deferred requests prefill per iteration, all "
        "together, so an on-time arrival never waits behind a long background iteration",
        min=1)
    late_max_running: int = knob(
        32, "slack: most deferred requests running at once (prefill or decode), so background "
        "work cannot crowd out on-time requests", min=1)
    late_yield: bool = knob(
        True, "slack: deferred decodes sit out an iteration that carries on-time prefill "
        "work (their KV stays), unless their next token is due before the next iteration "
        "could serve it (docs/lab/beyond.md, the background lane)")
    late_in_budget: bool = knob(
        False, "slack: deferred requests' decodes set the TBT budget too (they missed their "
        "TTFT, not their TBT): with a wide lane (late_max_running 64) this keeps the pooled "
        "TBT P99 and passes `tail` on AccelGen's mix, at a cost in goodput under load "
        "(docs/lab/beyond.md, the background lane)")
    late_bound: str = knob(
        "idle", "slack: deferred decodes narrow the TBT budget too, unless the first "
        "on-time prompt would then miss its TTFT: 'idle' only when no on-time decode sets "
        "it (else a whole prompt stretches their gaps), 'always' also beside on-time "
        "decodes, 'off' never (docs/lab/beyond.md, the lane bounded)", choices=LATE_BOUNDS)
    stall_share: float = knob(
        0.005, "slack: when the first queued prompt would miss its TTFT in chunks of the "
        "budget but makes it whole, it runs whole if every on-time decode's mean TBT still "
        "meets its SLO after that long iteration, and if the decode gaps over tail_tbt — "
        "those seen so far, whatever made them long, and those this iteration would "
        "stretch — stay within this share of all decode gaps planned (the pooled P99 TBT "
        "criterion allows 1 %); 0: never", min=0.0, max=0.01)
    tail_tbt: float | None = knob(
        None, "slack: the gap the pooled P99 TBT is judged against (Sarathi-Serve §5.1), "
        "for the stall budget; default: the deployment's TBT SLO (AccelGen's reading-speed "
        "anchor under its per-request mix)", min=0.001)
    alone_tight: float = knob(
        2.0, "slack: a prompt whose TTFT SLO is under this x its predicted prefill alone is "
        "tight: when beside the decodes it would miss its TTFT or end within 20 % of it "
        "(slack_stall.ALONE_MARGIN), it may run alone, the decodes waiting one iteration (a "
        "stall, under the same bounds as stall_share's; vLLM's prefill-only iteration); 0: "
        "never", min=0.0)
    pace: float = knob(
        0.5, "slack: while only decodes run and nothing waits, hold the next decode-only "
        "iteration (the GPU idles, so a prompt that arrives starts at once) until a decode's "
        "gap reaches this x its TBT SLO, or sooner (pace_quantile); only while recent "
        "arrivals include a phase-tight prompt (pace_gate); 0: never hold (vLLM)", min=0.0,
        max=1.0)
    pace_quantile: float = knob(
        0.75, "slack: a held decode-only iteration runs before the decodes' slack gets too "
        "short for a prompt of this quantile of the last 64 prompt lengths to run whole "
        "beside them under the TBT budget", min=0.0, max=1.0)
    pace_gate: float = knob(
        1.0, "slack: hold decodes only while one of the last 64 arrivals was phase-tight: "
        "its TTFT SLO less its predicted prefill alone (>= 0) under this x the decode-only "
        "iteration, so that a running iteration would make it late", min=0.0)
    first_token_cap: float = knob(
        1.2, "slack: a first token comes only when its iteration ends: once an iteration "
        "completes an on-time prompt's prefill, it takes more prefill only while its "
        "predicted time x this still ends by that prompt's TTFT deadline (1: the plain "
        "prediction; 0: off)", min=0.0)
    tile: int = knob(
        128, "slack: a TBT-bounded iteration's tokens (decodes and prefill chunks) are "
        "rounded down to a multiple of this, since a GEMM one token past a tile costs a "
        "whole tile more (tile quantization, Sarathi-Serve §4.3); 0: off", min=0)
    shed_window: int = knob(
        64, "slack: queued requests (in deadline order) that Moore-Hodgson and Smith's rule "
        "look at (0: only give up requests that cannot make it alone; plain order)", min=0)

    def resolved(self, *, tbt_slo: float | None = TBT_SLO,
                 slo_mix: str | None = None) -> SlackConfig:
        """``tail_tbt`` from the deployment's TBT SLO when unset (as the seeds' token budgets
        are: the live stack's is the gateway's ``--tbt-slo``); with none it stays unset and
        each request's own TBT SLO counts."""
        if self.tail_tbt is not None or tbt_slo is None:
            return self
        return replace(self, tail_tbt=tbt_slo)
