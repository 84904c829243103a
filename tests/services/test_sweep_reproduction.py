"""``docs/reproduction.md`` rendered by ``sloserve sweep report --template reproduction``
from the checked-in specs and tables (issue 37, item 4): byte for byte the checked-in
file; a cell without a result is an error naming the table; ``--cells`` picks cells."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sloserve.services.cli import main
from sloserve.services.sweep.reproduction import SPECS, build, spec_rows
from sloserve.services.sweep.spec import (
    SpecError,
    load_spec,
    select_cells,
    without_as_before,
)

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "infra" / "sweeps"
DOCS = ROOT / "docs"


def _copy_inputs(tmp: Path) -> tuple[Path, Path]:
    """The reproduction specs + tables and the docs inputs, copied under ``tmp``."""
    sweeps, docs = tmp / "sweeps", tmp / "docs"
    sweeps.mkdir()
    for name in SPECS.values():
        shutil.copy(SWEEPS / name, sweeps / name)
        table = name.replace(".yaml", ".results.jsonl")
        shutil.copy(SWEEPS / table, sweeps / table)
    shutil.copytree(DOCS / "results" / "reproduction", docs / "results" / "reproduction")
    shutil.copy(DOCS / "reproduction.md", docs / "reproduction.md")
    return sweeps, docs


def test_reproduction_doc_renders_byte_for_byte_from_the_checked_in_specs() -> None:
    assert build(SWEEPS, DOCS, plots=False) == (DOCS / "reproduction.md").read_text()


def test_every_reproduction_cell_has_its_result_in_the_checked_in_table() -> None:
    for name in SPECS.values():
        spec = load_spec(SWEEPS / name)
        rows = spec_rows(SWEEPS, name)
        assert [r["cell"] for r in rows] == [c.hash for c in spec.cells]
        # a row written before an option existed lacks it: equal but for those at their
        # as-before value (AS_BEFORE), which is what that row ran
        assert all(without_as_before(r["config"]) == without_as_before(c.config)
                   for r, c in zip(rows, spec.cells))
    assert len(load_spec(SWEEPS / SPECS["sarathi"]).cells) == 12
    assert len(load_spec(SWEEPS / SPECS["ascendra"]).cells) == 24


def test_template_command_writes_the_doc_and_its_plots(tmp_path: Path) -> None:
    sweeps, docs = _copy_inputs(tmp_path)
    before = (docs / "reproduction.md").read_text()
    assert (
        main(["sweep", "report", str(sweeps), "--template", "reproduction", "--out", str(docs)])
        == 0
    )
    assert (docs / "reproduction.md").read_text() == before
    for png in ("sarathi_capacity.png", "ascendra_fig9.png"):
        assert (docs / "reproduction" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_cell_missing_from_its_table_is_an_error_naming_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweeps, docs = _copy_inputs(tmp_path)
    table = sweeps / SPECS["sarathi"].replace(".yaml", ".results.jsonl")
    lines = table.read_text().splitlines(keepends=True)
    table.write_text("".join(lines[:-1]))
    before = (docs / "reproduction.md").read_text()
    assert (
        main(["sweep", "report", str(sweeps), "--template", "reproduction", "--out", str(docs)])
        == 2
    )
    err = capsys.readouterr().err
    assert str(table) in err and "1 of 12 cells" in err
    assert (docs / "reproduction.md").read_text() == before  # nothing written


def test_a_row_written_for_another_config_is_not_used(tmp_path: Path) -> None:
    """A row is found by its cell's hash: the same labels with another config do not count."""
    sweeps, _ = _copy_inputs(tmp_path)
    table = sweeps / SPECS["sarathi"].replace(".yaml", ".results.jsonl")
    rows = [json.loads(x) for x in table.read_text().splitlines()]
    rows[0]["cell"] = "0" * 16
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="1 of 12 cells"):
        spec_rows(sweeps, SPECS["sarathi"])


def test_cells_option_selects_cells_by_unique_hash_prefix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = load_spec(SWEEPS / SPECS["ascendra"])
    pick = [spec.cells[3].hash[:8], spec.cells[7].hash]
    assert select_cells(spec, ",".join(pick)) == {spec.cells[3].hash, spec.cells[7].hash}
    with pytest.raises(SpecError, match="'zz' names 0 cells"):
        select_cells(spec, "zz")
    with pytest.raises(SpecError, match="at least one cell"):
        select_cells(spec, "")
    assert (
        main(["sweep", str(SWEEPS / SPECS["ascendra"]), "--dry-run", "--cells", ",".join(pick)])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == [spec.cells[3].hash, spec.cells[7].hash]
    assert all("  done  " in line for line in out)
