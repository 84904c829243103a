"""Event order: by time; batch ends before arrivals at equal times; ties in push/request order."""

from __future__ import annotations

from sloserve.sim.events import BatchEnds, arrival_order


def test_arrivals_are_taken_by_time_with_ties_in_request_order() -> None:
    assert list(arrival_order([0.5, 0.1, 0.5, 0.1])) == [1, 3, 0, 2]
    assert list(arrival_order([0.0, 0.0, 1.0])) == [0, 1, 2]


def test_equal_batch_ends_pop_in_the_order_they_were_pushed() -> None:
    ends = BatchEnds()
    for t, k in ((2.0, 5), (1.0, 3), (2.0, 1), (1.0, 9)):
        ends.push(t, k)
    assert [ends.pop()[::2] for _ in range(len(ends))] == [(1.0, 3), (1.0, 9), (2.0, 5),
                                                            (2.0, 1)]
    assert not ends
