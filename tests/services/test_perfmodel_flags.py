"""The perf-model service's refit period: what it says in its fits, and a bad one refused."""

from __future__ import annotations

import pytest

from sloserve.services.perfmodel.server import build_parser


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_a_refit_interval_that_is_not_a_positive_number_is_refused_naming_the_flag(
        bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--port", "1", "--refit-interval", bad])
    assert exc.value.code == 2
    assert "--refit-interval" in capsys.readouterr().err


def test_a_refit_interval_in_seconds_is_taken() -> None:
    parse = build_parser().parse_args
    assert parse(["--port", "1", "--refit-interval", "0.25"]).refit_interval == 0.25
    assert parse(["--port", "1"]).refit_interval == 1.0
