"""``metrics.observe_all`` (a streamed group's ITL/TPOT at once, issue 33, item 3) leaves
every histogram exactly as ``observe`` one value at a time would, bucket edges included."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from sloserve.services import metrics


def _samples(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in reg.collect() for s in m.samples if not s.name.endswith("_created")}


def test_a_group_observed_at_once_equals_one_at_a_time() -> None:
    values = [0.0, 0.01, 0.010001, 0.3, 0.3, 2.5, 79.0, 80.0, 81.0, 0.049999, 0.05]
    one, both = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("itl", "x", ["engine"], buckets=metrics.ITL_BUCKETS, registry=one)
    t1 = Histogram("tpot", "x", ["engine"], buckets=metrics.ITL_BUCKETS, registry=one)
    for v in values:
        h1.labels("e0").observe(v)
        t1.labels("e0").observe(v)
    h2 = Histogram("itl", "x", ["engine"], buckets=metrics.ITL_BUCKETS, registry=both)
    t2 = Histogram("tpot", "x", ["engine"], buckets=metrics.ITL_BUCKETS, registry=both)
    metrics.observe_all((h2.labels("e0"), t2.labels("e0")), values[:4])
    metrics.observe_all((h2.labels("e0"), t2.labels("e0")), values[4:])
    metrics.observe_all((h2.labels("e0"), t2.labels("e0")), [])
    assert _samples(both) == _samples(one)
