"""Sweeps on Ray (issue 37, items 2 and 3): a cell's numbers are the ``capacity``
command's, a re-run computes only the cells missing from the table (after a kill or a spec
edit), and the report page loads every plot in headless Chromium.

One local Ray session (2 CPUs) serves the module: its start-up is the slow part here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from sloserve.services.sweep.report import write_report  # noqa: E402
from sloserve.services.sweep.runner import read_table, run_sweep  # noqa: E402
from sloserve.services.sweep.spec import Spec, load_spec, parse_spec  # noqa: E402

TINY: dict[str, Any] = {
    "name": "tiny",
    "options": {"num_requests": 80, "trace": "sharegpt"},
    "axes": {"policy": ["vllm", "sarathi"], "slo": [{"tbt_slo": 0.1}, {"tbt_slo": 0.2}]},
    "measure": {"capacity": {"criteria": ["goodput"]}},
}


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    roots = os.pathsep.join(sorted({str(Path(p).resolve().parent)
                                    for p in __import__("sloserve").__path__}))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": roots + os.pathsep
                                       + os.environ.get("PYTHONPATH", "")}})
    yield
    ray.shutdown()


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_sweep_capacities_equal_the_capacity_command_cell_by_cell(
        ray_session: None, tmp_path: Path) -> None:
    spec = parse_spec(TINY)
    table = tmp_path / "t.jsonl"
    stats = run_sweep(spec, table, progress=False)
    assert sorted(stats.computed) == sorted(c.hash for c in spec.cells) and not stats.failed
    rows = {r["cell"]: r for r in read_table(table)}
    assert len(rows) == 4
    for cell in spec.cells:
        row = rows[cell.hash]
        assert row["node_id"] and row["host"] and row["wall_s"] > 0
        assert row["config"] == cell.config and row["labels"] == cell.labels
        cli = subprocess.run([sys.executable, "-m", "sloserve.services.cli", "capacity",
                              *cell.argv, "--json"], capture_output=True, text=True,
                             timeout=120, check=True)
        assert row["result"] == json.loads(cli.stdout), cell.command()
    caps = {(r["labels"]["policy"], r["labels"]["slo"]): r["result"]["capacity_qps"]
            for r in rows.values()}
    assert all(c > 0 for c in caps.values())


def test_rerun_after_a_spec_edit_computes_only_the_new_cells(
        ray_session: None, tmp_path: Path) -> None:
    table = tmp_path / "t.jsonl"
    first = run_sweep(parse_spec(TINY), table, progress=False)
    before = _lines(table)
    edited = {**TINY, "axes": {**TINY["axes"], "slo": [*TINY["axes"]["slo"], {"tbt_slo": 0.3}]}}
    spec = parse_spec(edited)
    again = run_sweep(spec, table, progress=False)
    new = {c.hash for c in spec.cells} - set(first.computed)
    assert len(new) == 2 and set(again.computed) == new
    assert sorted(again.skipped) == sorted(first.computed)
    assert _lines(table)[:len(before)] == before  # the old rows untouched
    assert len(_lines(table)) == 6


def test_killed_sweep_resumes_computing_only_the_missing_cells(
        ray_session: None, tmp_path: Path) -> None:
    """A real kill: the CLI's whole process group (its own local Ray too) gets SIGKILL
    once two cells are in the table; the re-run computes exactly the rest."""
    spec_file = tmp_path / "kill.yaml"
    spec_file.write_text(
        "options: {num_requests: 150, trace: sharegpt}\n"
        "axes:\n  policy: [vllm, sarathi, accelgen]\n  seed: [0, 1, 2]\n"
        "measure: {capacity: {criteria: [goodput]}}\n")
    table = tmp_path / "kill.results.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "sloserve.services.cli", "sweep",
                             str(spec_file), "--workers", "1"],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if table.exists() and table.read_text().count("\n") >= 2:
                break
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    kept = read_table(table)
    spec = load_spec(spec_file)
    assert 2 <= len(kept) < len(spec.cells), "the sweep was not killed half way"
    with table.open("a") as f:  # a kill mid-write: half a row
        f.write('{"cell": "deadbeef", "res')
    stats = run_sweep(spec, table, progress=False)
    done = {r["cell"] for r in kept}
    assert sorted(stats.skipped) == sorted(done)
    assert sorted(stats.computed) == sorted(c.hash for c in spec.cells if c.hash not in done)
    rows = read_table(table)
    assert sorted(r["cell"] for r in rows) == sorted(c.hash for c in spec.cells)


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser",
                                               "google-chrome")) if p), None)


def _images_loaded(browser: str, index: Path, tmp: Path) -> str:
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp}",
         "--virtual-time-budget=5000", "--dump-dom", index.as_uri()],
        capture_output=True, text=True, timeout=120).stdout
    start = dom.find('data-images="')
    assert start >= 0, "the page's script did not run"
    return dom[start + len('data-images="'):dom.index('"', start + len('data-images="'))]


def test_report_page_loads_every_plot_in_headless_chromium(
        ray_session: None, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium binary (apt-get install chromium)")
    doc = {**TINY, "measure": {"capacity": {"criteria": ["goodput", "tail"]},
                               "rates": [1.0, 2.0]}}
    spec: Spec = parse_spec(doc)
    table = tmp_path / "t.jsonl"
    run_sweep(spec, table, progress=False)
    index = write_report(table, tmp_path / "report")
    plots = json.loads((tmp_path / "report" / "plots.json").read_text())
    # a bar chart per criterion, a goodput-vs-rate chart per SLO
    assert len(plots) == 4 and all(p.endswith(".png") for p in plots)
    page = index.read_text()
    assert all(f'src="{p}"' in page for p in plots)
    at = [page.find(c.hash) for c in spec.cells]
    assert min(at) >= 0 and at == sorted(at)  # the table in the spec's order
    assert _images_loaded(browser, index, tmp_path / "profile") == "4/4"
    (tmp_path / "report" / plots[0]).unlink()  # what the check sees when a plot is missing
    assert _images_loaded(browser, index, tmp_path / "profile2") == "3/4"


def test_reading_a_table_mid_write_leaves_the_file_alone(tmp_path: Path) -> None:
    """The report (or --dry-run) may read a table a sweep is appending to: the half row is
    left out and left in place; only the sweep about to append cuts it off."""
    table = tmp_path / "t.jsonl"
    body = '{"cell": "a", "result": {}}\n{"cell": "b", "res'
    table.write_text(body)
    assert [r["cell"] for r in read_table(table)] == ["a"]
    assert table.read_text() == body
    assert [r["cell"] for r in read_table(table, repair=True)] == ["a"]
    assert table.read_text() == '{"cell": "a", "result": {}}\n'
