"""A whole-stack restart on the same Redis and prefix (issue 34, item 6): every accepted
request resumes (its client re-attaches by request id and gets the rest of its stream) or
ends with a status its client can fetch and a log line, never silently."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from sloserve.services.drills.restart import drill
from sloserve.services.stack import Stack

N, MAX_TOKENS = 30, 150


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "crash"])
def test_after_a_whole_stack_restart_every_client_reattaches_and_gets_the_rest_of_its_stream(
    start_stack: Callable[..., Stack],
    sig: int,
) -> None:
    stack = start_stack(policy="sarathi", instances=2, time_scale=2.0)
    outcomes, down = drill(stack, N, MAX_TOKENS, sig)
    print(f"down {down:.1f}s; before the restart: {sorted(o.before for o in outcomes)}")
    assert all(0 < o.before < MAX_TOKENS for o in outcomes)  # every one cut mid-stream
    assert [o.row() for o in outcomes if not (o.resumed and o.logged)] == []
    sched = (stack.cfg.log_dir / "scheduler-lp0.log").read_text()  # type: ignore[operator]
    assert '"restored_offered"' in sched


def test_a_restored_request_nobody_reattaches_to_ends_with_a_status_and_a_log_line(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi", instances=2, time_scale=2.0)

    def short_grace(s: Stack) -> None:  # the gateway gives up on them after 1 s
        s.plan = _with_gateway_flags(s, "--reattach-grace", "1")  # type: ignore[method-assign]

    outcomes, _ = drill(
        stack,
        6,
        MAX_TOKENS,
        signal.SIGTERM,
        prefix="late",
        attach_after_s=3.0,
        on_restart=short_grace,
    )
    for o in outcomes:
        assert not o.resumed
        assert o.status.startswith("ABORTED: request late-"), o.status
        assert "not re-attached within 1 s" in o.status
        assert o.logged, o.request_id


def _with_gateway_flags(stack: Stack, *flags: str) -> Callable[[], None]:
    plan = stack.plan

    def planned() -> None:
        plan()
        stack.services["gateway"].argv += list(flags)

    return planned
