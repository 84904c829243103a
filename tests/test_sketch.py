"""The quantile sketch answers numpy's percentiles within its stated relative error."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.sketch import QuantileSketch

QS = (0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0)


def _sketch(values: np.ndarray, chunks: int = 1, rel_err: float = 1e-3) -> QuantileSketch:
    s = QuantileSketch(rel_err)
    for part in np.array_split(values, chunks):
        s.add(part)
    return s


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e4)), min_size=1, max_size=400),
       st.integers(1, 5), st.sampled_from([1e-3, 1e-2]))
def test_percentiles_are_within_the_relative_error_of_numpys(
        values: list[float], chunks: int, rel_err: float) -> None:
    v = np.array(values)
    got = _sketch(v, chunks, rel_err).percentiles(*QS)
    for g, want in zip(got, np.percentile(v, QS), strict=True):
        assert g is not None
        assert abs(g - want) <= rel_err * want + 1e-12


def test_memory_does_not_grow_with_the_count() -> None:
    rng = np.random.default_rng(0)
    big = _sketch(rng.uniform(0.01, 1.0, 1_000_000), chunks=10)
    assert big.count == 1_000_000
    # set by the value range, log(max / min) / log(gamma), never by the count
    assert big.num_buckets <= math.ceil(math.log(1.0 / 0.01) / math.log(big.gamma)) + 1


def test_counts_zeros_and_mean_exactly() -> None:
    s = _sketch(np.array([0.0, 0.0, 0.5, 1.5]))
    assert s.zeros == 2 and s.count == 4 and s.mean() == pytest.approx(0.5)
    assert s.percentiles(25.0) == [0.0]


def test_empty_sketch_has_no_percentiles() -> None:
    assert QuantileSketch().percentiles(50.0, 99.0) == [None, None]
    assert QuantileSketch().mean() is None


@pytest.mark.parametrize("bad", [[-1.0], [float("nan")], [float("inf")]])
def test_negative_nan_or_infinite_values_are_refused_and_nothing_changes(
        bad: list[float]) -> None:
    s = _sketch(np.array([1.0]))
    with pytest.raises(ValueError, match="values"):
        s.add(np.array(bad))
    assert s.count == 1 and s.percentiles(50.0) == [1.0]


def test_rel_err_out_of_range_names_the_field() -> None:
    with pytest.raises(ValueError, match="rel_err"):
        QuantileSketch(0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e4)), max_size=200),
                min_size=1, max_size=4))
def test_merged_sketches_are_the_sketch_of_all_values(parts: list[list[float]]) -> None:
    """Bucket-wise merge (``--workers``): the same buckets, zeros, count, extremes and
    percentiles as one sketch of every value; the running sum up to summation order."""
    merged = QuantileSketch()
    for p in parts:
        one = QuantileSketch()
        one.add(np.array(p))
        merged.merge(one)
    whole = _sketch(np.array([x for p in parts for x in p]))
    assert merged.num_buckets == whole.num_buckets
    assert merged._lo == whole._lo or whole.num_buckets == 0
    assert np.array_equal(merged._counts, whole._counts)
    assert (merged.zeros, merged.count, merged.min, merged.max) == (
        whole.zeros, whole.count, whole.min, whole.max)
    assert merged.percentiles(*QS) == whole.percentiles(*QS)
    assert merged.total == pytest.approx(whole.total, rel=1e-12, abs=1e-300)


def test_merge_refuses_another_relative_error() -> None:
    with pytest.raises(ValueError, match="rel_err"):
        QuantileSketch(1e-3).merge(QuantileSketch(1e-2))
