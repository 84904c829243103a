"""The commands' shared number flags: bounded and finite, refused naming the flag."""

from __future__ import annotations

import argparse

import pytest

from sloserve.services.argtypes import number, positive


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    p.add_argument("--qps", type=positive(float))
    p.add_argument("--repeats", type=number(int, 1, strict=False))
    return p


@pytest.mark.parametrize(("argv", "words"), [
    (["--qps", "0"], "--qps: must be > 0, got 0"),
    (["--qps", "nan"], "--qps: must be > 0, got nan"),
    (["--qps", "inf"], "--qps: must be > 0, got inf"),
    (["--qps", "fast"], "--qps: 'fast' is not a number"),
    (["--repeats", "0"], "--repeats: must be >= 1, got 0"),
    (["--repeats", "1.5"], "--repeats: '1.5' is not an integer"),
])
def test_a_bad_number_is_refused_naming_the_flag(
        argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    assert words in capsys.readouterr().err


def test_numbers_in_range_are_taken() -> None:
    args = _parser().parse_args(["--qps", "0.25", "--repeats", "1"])
    assert (args.qps, args.repeats) == (0.25, 1)
