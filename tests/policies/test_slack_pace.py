"""``slack``'s decode pacing (``policies/slack_pace.py``): while only decodes run
and nothing waits, a decode-only iteration is held (an empty plan with a timer) so that a
prompt arriving meanwhile finds the GPU idle — only after a phase-tight arrival, only where
the driver offers timers, and never past what a typical prompt needs whole."""

from __future__ import annotations

import pytest

from sloserve.batch import BatchPlan, BatchShape, ScheduledItem
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies.base import InstanceView, Policy
from sloserve.policies.slack import SlackConfig, SlackPolicy
from sloserve.request import SLO, Request

PERF = LinearPerfModel()  # 10 ms + 0.2 ms per token + 0.1 us per context token
TBT = 0.2


def alone(prompt: int) -> float:
    return PERF.predict(BatchShape(prefills=((prompt, 0),)))


def decoding(tight_slack: float, timers: bool = True, tbt: float = TBT, prompt: int = 100,
             **knobs: object) -> tuple[Instance, float]:
    """A running decode (``prompt`` tokens, TBT SLO ``tbt``) whose last token came at the
    returned time, after a one-token request whose TTFT SLO was its predicted prefill alone
    plus ``tight_slack`` arrived and finished; nothing waits."""
    i = Instance("lp0", SlackPolicy(SlackConfig(**knobs)), BlockManager(4000, 16), PERF,
                 timers=timers)
    i.add_request(Request("d", 0.0, prompt, 50, SLO(ttft=1.0, tbt=tbt)), 0.0)
    plan, _, _ = i.schedule(0.0)
    i.complete(plan, 0.05)
    i.add_request(Request("t", 0.06, 50, 1, SLO(ttft=alone(50) + tight_slack, tbt=tbt)), 0.06)
    plan, _, _ = i.schedule(0.06)
    assert {it.request_id for it in plan.items} == {"d", "t"}
    i.complete(plan, 0.09)
    return i, 0.09


def test_decodes_wait_for_the_next_prompt_until_half_their_tbt_slo() -> None:
    i, last = decoding(tight_slack=0.005)  # under one decode-only iteration (~10 ms)
    plan, _, _ = i.schedule(last + 0.001)
    assert not plan.items
    assert plan.wake_at == pytest.approx(last + 0.5 * TBT)


def test_a_prompt_that_arrives_while_decodes_wait_starts_at_once_whole() -> None:
    """(Alone: the tight-prompt rule lets the held decode wait one iteration more.)"""
    i, last = decoding(tight_slack=0.005)
    assert not i.schedule(last + 0.001)[0].items
    i.add_request(Request("n", last + 0.02, 80, 5, SLO(ttft=alone(80) + 0.005, tbt=TBT)),
                  last + 0.02)
    plan, _, _ = i.schedule(last + 0.02)
    assert ("n", 80) in [(it.request_id, it.num_tokens) for it in plan.items]
    assert i.requests["n"].first_scheduled_time == last + 0.02
    assert plan.wake_at is None


def test_at_its_timer_the_held_decode_runs() -> None:
    i, last = decoding(tight_slack=0.005)
    wake = i.schedule(last + 0.001)[0].wake_at
    assert wake is not None
    plan, _, _ = i.schedule(wake)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("d", 1)]


@pytest.mark.parametrize("case", ["no timers", "loose ttft", "pace 0", "gate 0"])
def test_decodes_run_at_once(case: str) -> None:
    """No timers (the event clock, the plan driver); no phase-tight arrival (its slack is
    more than a decode-only iteration: waiting for one costs it nothing); pacing off."""
    i, last = decoding(
        tight_slack=0.05 if case == "loose ttft" else 0.005, timers=case != "no timers",
        pace=0.0 if case == "pace 0" else 0.5, pace_gate=0.0 if case == "gate 0" else 1.0)
    plan, _, _ = i.schedule(last + 0.001)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("d", 1)]


def test_decodes_keep_room_for_a_typical_recent_prompt_to_run_whole() -> None:
    """The tighter TBT SLO leaves less slack than half of it: the hold ends when what is
    left would fit the ``pace_quantile`` prompt (here the 400-token one: index 0.75 x 2)
    whole beside the decode under the budget (``tbt_margin``)."""
    i, last = decoding(tight_slack=0.005, tbt=0.12, prompt=400)
    plan, _, _ = i.schedule(last + 0.001)
    whole = PERF.predict(BatchShape(prefills=((400, 0),), decodes=(401,)))
    assert plan.wake_at == pytest.approx(last + 0.12 - whole / 0.8)
    assert plan.wake_at < last + 0.5 * 0.12


def test_no_hold_when_the_typical_prompt_would_not_fit_whole_any_more() -> None:
    i, last = decoding(tight_slack=0.005, tbt=0.12, prompt=400)
    whole = PERF.predict(BatchShape(prefills=((400, 0),), decodes=(401,)))
    plan, _, _ = i.schedule(last + 0.12 - whole / 0.8 + 1e-6)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("d", 1)]


class _Timer(Policy):
    """A policy whose plan is given by the test (the driver-side checks of ``wake_at``)."""

    name = "timer-test"

    def __init__(self, plan: BatchPlan) -> None:
        super().__init__()
        self.plan = plan

    def schedule(self, view: InstanceView) -> BatchPlan:
        return self.plan


@pytest.mark.parametrize(("plan_wake", "timers", "match"), [
    (1.0, False, "this driver offers none"),
    (0.5, True, "not after now"),
    (float("nan"), True, "not after now"),
])
def test_a_bad_timer_is_refused_by_name(plan_wake: float, timers: bool, match: str) -> None:
    i = Instance("lp0", _Timer(BatchPlan(wake_at=plan_wake)), BlockManager(10, 16), PERF,
                 timers=timers)
    i.add_request(Request("a", 0.0, 10, 2, SLO()), 0.0)
    with pytest.raises(ValueError, match=f"plan.wake_at: _Timer .*{match}"):
        i.schedule(0.5)


def test_a_timer_on_a_plan_with_items_is_refused() -> None:
    plan = BatchPlan(items=[ScheduledItem("a", 10, 0, True)], wake_at=1.0)
    i = Instance("lp0", _Timer(plan), BlockManager(10, 16), PERF, timers=True)
    i.add_request(Request("a", 0.0, 10, 2, SLO()), 0.0)
    with pytest.raises(ValueError, match="plan.wake_at: _Timer set a timer on a plan with"):
        i.schedule(0.5)
    assert i.waiting and not i.running  # nothing applied
