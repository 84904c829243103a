"""``sloserve compare``'s default rows are the policies a user chooses between; the
papers' baselines come only with ``--baselines``, each labelled; a one-line legend
follows the table (issue 32 item 3)."""

from __future__ import annotations

import json

import pytest

from sloserve.policies import compared_names, get_spec, policy_names
from sloserve.services.cli import main

SMALL = ["compare", "--num-requests", "40", "--qps", "4"]


def rows_of(out: str) -> list[str]:
    """The table's rows: the lines between the header and the legend."""
    lines = out.strip().splitlines()
    return lines[2:-1]


def test_compare_shows_the_policies_to_choose_between_and_a_legend(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    rows = rows_of(out)
    shown = [r.split()[0] for r in rows]
    assert shown == compared_names() == [p for p in policy_names() if not get_spec(p).baseline]
    assert "orca" not in shown and "oracle" not in shown
    legend = out.strip().splitlines()[-1]
    assert legend.startswith("legend:") and "goodput_share" in legend and "--baselines" in legend


def test_baselines_come_only_on_request_and_each_says_what_it_is(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--baselines"]) == 0
    rows = rows_of(capsys.readouterr().out)
    labelled = {r.split()[0]: r for r in rows if r.rstrip().endswith(")")}
    assert set(labelled) == {"orca", "oracle"}
    assert "(baseline: Orca" in labelled["orca"] and "(reference:" in labelled["oracle"]
    assert len(rows) == len(policy_names())


def test_compare_json_keeps_the_same_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == compared_names()
