"""A scheduler coalesces a frontend's tokens across ``--stream-interval`` iterations
(issue 33, item 3; ``scheduler/coalesce.py``): K iterations make one message per
frontend, a first or last token, an offload, a drop and an urgent report never wait, and
every held token carries how long it waited (``TokenEvent.held_s``)."""

from __future__ import annotations

import time

import pytest

from sloserve.services.proto import scheduler_pb2
from sloserve.services.scheduler.coalesce import Coalescer

K = 4


def _iteration(t: float, *tokens: tuple[str, int, bool]) -> scheduler_pb2.SchedulerOutput:
    out = scheduler_pb2.SchedulerOutput(time=t)
    for rid, index, finished in tokens:
        out.tokens.add(request_id=rid, index=index, token_id=100 + index, time=t,
                       finished=finished)
    out.state.num_waiting_prefills = 0
    return out


def _ids(msg: scheduler_pb2.SchedulerOutput) -> list[tuple[str, int]]:
    return [(t.request_id, t.index) for t in msg.tokens]


def test_k_iterations_make_one_message_first_and_last_tokens_never_wait() -> None:
    c = Coalescer(K)
    fe = object()  # one frontend's stream
    first = c.offer(fe, _iteration(0.0, ("a", 0, False), ("b", 0, False)))
    assert first is not None and _ids(first) == [("a", 0), ("b", 0)]  # at once
    assert first.tokens[0].held_s == 0.0
    sent = []
    for k in range(1, 2 * K + 1):
        time.sleep(0.002)
        msg = c.offer(fe, _iteration(float(k), ("a", k, False), ("b", k, False)))
        if msg is not None:
            sent.append((k, msg))
    assert [k for k, _ in sent] == [K, 2 * K]  # one message every K iterations
    k, msg = sent[0]
    assert _ids(msg) == [(r, i) for i in range(1, K + 1) for r in ("a", "b")]  # in order
    held = [t.held_s for t in msg.tokens]
    assert held[0] >= 0.002 * (K - 1) and held[-1] == 0.0  # each its own wait
    assert held == sorted(held, reverse=True)
    assert [t.time for t in msg.tokens] == [float(i) for i in range(1, K + 1) for _ in "ab"]
    assert msg.HasField("state") and msg.time == float(K)
    # a held token, then a last one: both leave at once, nothing of "a" stays behind
    assert c.offer(fe, _iteration(20.0, ("a", 2 * K + 1, False), ("b", 2 * K + 1, False))) \
        is None
    last = c.offer(fe, _iteration(21.0, ("a", 2 * K + 2, True), ("b", 2 * K + 2, False)))
    assert last is not None
    assert _ids(last) == [("a", 2 * K + 1), ("b", 2 * K + 1), ("a", 2 * K + 2),
                          ("b", 2 * K + 2)]
    assert c.held_tokens() == 0


def test_offloads_drops_and_urgent_reports_leave_at_once_each_frontend_its_own() -> None:
    c = Coalescer(K)
    one, two = object(), object()
    assert c.offer(one, _iteration(1.0, ("a", 3, False))) is None
    assert c.offer(two, _iteration(1.0, ("b", 3, False))) is None
    drop = scheduler_pb2.SchedulerOutput(
        time=2.0, dropped=[scheduler_pb2.Drop(request_id="a", reason="slack: late")])
    msg = c.offer(one, drop)
    assert msg is not None and _ids(msg) == [("a", 3)] and msg.dropped[0].reason
    assert c.held_tokens() == 1  # the other frontend's stays held
    off = c.offer(two, scheduler_pb2.SchedulerOutput(time=3.0, offloaded=["b"]))
    assert off is not None and _ids(off) == [("b", 3)] and list(off.offloaded) == ["b"]
    assert c.offer(one, _iteration(4.0, ("c", 5, False))) is None
    report = c.offer(one, _iteration(5.0), urgent=True)  # the Controller's news
    assert report is not None and _ids(report) == [("c", 5)] and report.HasField("state")
    assert c.offer(two, _iteration(6.0, ("d", 1, False))) is None
    flushed = c.flush_all(7.0)  # the loop goes idle
    assert [(d is two, _ids(m), m.time) for d, m in flushed] == [(True, [("d", 1)], 7.0)]
    assert c.held_tokens() == 0


def test_interval_one_sends_every_message_as_it_is_and_below_one_is_refused() -> None:
    c = Coalescer(1)
    out = _iteration(1.0, ("a", 4, False))
    assert c.offer(object(), out) is out
    with pytest.raises(ValueError, match="stream_interval"):
        Coalescer(0)
