"""Sweep specs (issue 37, item 1): the cross product of axes into cells, each the exact
``simulate``/``capacity`` command line, named by its resolved config's hash; a bad spec
is refused naming the key, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sloserve.services.cli import main
from sloserve.services.sweep.runner import longest_first, run_cell, table_costs
from sloserve.services.sweep.spec import SpecError, cell_hash, load_spec, parse_spec


def _spec(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "t",
        "options": {"num_requests": 50, "trace": "sharegpt"},
        "axes": {"policy": ["vllm", {"policy": "sarathi", "token_budget": 256}],
                 "slo": [{"tbt_slo": 0.1}, {"tbt_slo": 0.2, "ttft_slo": 2.0}]},
        "measure": {"rates": [1.0, 2.0], "capacity": {"criteria": ["goodput", "tail"]}},
    }
    doc.update(over)
    return doc


def test_cross_product_gives_one_cell_per_point_and_measurement() -> None:
    cells = parse_spec(_spec()).cells
    assert len(cells) == 2 * 2 * (2 + 2)
    assert len({c.hash for c in cells}) == len(cells)
    kinds = [c.kind for c in cells]
    assert kinds.count("simulate") == 8 and kinds.count("capacity") == 8
    one = next(c for c in cells if c.labels["policy"] == "sarathi token_budget=256"
               and c.labels["slo"] == "tbt_slo=0.2 ttft_slo=2.0"
               and c.labels["measure"] == "capacity tail")
    assert one.command() == ("sloserve capacity --num-requests 50 --trace sharegpt --policy "
                             "sarathi --token-budget 256 --tbt-slo 0.2 --ttft-slo 2.0 "
                             "--criterion tail")
    assert one.config["token_budget"] == 256 and one.config["criterion"] == "tail"
    assert one.config["gpu"] == "a100"  # resolved: the command's defaults filled in


def test_an_axis_item_may_bring_its_own_rates_or_capacity_search() -> None:
    doc = _spec(axes={"policy": ["vllm", "sarathi"],
                      "workload": [{"trace": "sharegpt", "measure": {"rates": [1.0, 2.0]}},
                                   {"trace": "arxiv"}]},
                measure={"capacity": {"criteria": "tail", "qps_start": 0.5}})
    cells = parse_spec(doc).cells
    got = sorted((c.labels["workload"], c.labels["measure"]) for c in cells
                 if c.labels["policy"] == "vllm")
    assert got == [("trace=arxiv", "capacity tail"), ("trace=sharegpt", "1 req/s"),
                   ("trace=sharegpt", "2 req/s")]
    assert {c.config["qps_start"] for c in cells if c.kind == "capacity"} == {0.5}
    no_top = {**doc, "measure": None}
    del no_top["measure"]
    with pytest.raises(SpecError, match=r"^measure: missing"):
        parse_spec(no_top)  # arxiv has no measurement then
    twice = _spec(axes={"policy": [{"policy": "vllm", "measure": {"rates": [1.0]}}],
                        "w": [{"trace": "arxiv", "measure": {"rates": [2.0]}}]})
    with pytest.raises(SpecError, match=r"^axes\.w\[0\]\.measure: also set by axes\.policy"):
        parse_spec(twice)


def test_cell_hash_is_the_resolved_config_not_its_spelling() -> None:
    a = parse_spec(_spec()).cells
    # the same configs spelled otherwise: defaults written out, an option moved between
    # options and an axis, other labels, other axis names
    b = parse_spec(_spec(
        options={"trace": "sharegpt", "gpu": "a100", "seed": 0},
        axes={"policy": ["vllm", {"policy": "sarathi", "token_budget": 256, "label": "S"}],
              "tbt": [{"tbt_slo": 0.1, "num_requests": 50},
                      {"tbt_slo": 0.2, "ttft_slo": 2.0, "num_requests": 50}]})).cells
    assert [c.hash for c in a] == [c.hash for c in b]
    c = parse_spec(_spec(options={"num_requests": 50, "trace": "sharegpt", "seed": 1})).cells
    assert not {x.hash for x in a} & {x.hash for x in c}


def test_trace_file_cell_is_named_by_the_file_content_not_its_path(tmp_path: Path) -> None:
    rows = "input_len,output_len\n" + "".join(f"{100 + i},{20 + i}\n" for i in range(30))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "t.csv").write_text(rows)
    (tmp_path / "b" / "t.csv").write_text(rows)

    def hashes(folder: str) -> list[str]:
        doc = _spec(options={"num_requests": 20, "trace_file": "t.csv"})
        return [c.hash for c in parse_spec(doc, base=tmp_path / folder).cells]

    assert hashes("a") == hashes("b")
    (tmp_path / "b" / "t.csv").write_text(rows + "500,50\n")
    assert not set(hashes("a")) & set(hashes("b"))


@pytest.mark.parametrize(("over", "key"), [
    ({"axes": {"slo": [{"tbt_slo": 0.1}, {"tbt_slo": -1}]}}, "axes.slo[1].tbt_slo:"),
    ({"axes": {"policy": ["vllm", "nope"]}}, "axes.policy[1].policy:"),
    ({"axes": {"policy": [{"policy": "vllm", "token_budget": 9}]}},
     "axes.policy[0].token_budget:"),
    ({"axes": {"w": [{"trce": "arxiv"}]}}, "axes.w[0].trce: unknown option"),
    ({"axes": {"w": [{"trace": "nosuch"}]}}, "axes.w[0].trace: unknown trace"),
    ({"axes": {"w": [{"trace_file": "missing.csv"}]}}, "axes.w[0].trace_file:"),
    ({"axes": {"w": ["arxiv"]}}, "axes.w[0]: a bare value"),
    ({"axes": {"policy": []}}, "axes.policy: must not be empty"),
    ({"axes": {"policy": ["vllm"], "s": [{"qps": 3}]}}, "axes.s[0].qps: unknown option"),
    ({"axes": {"policy": ["vllm"], "a": [{"seed": 1}], "b": [{"seed": 2}]}},
     "axes.b[0].seed: also set by axes.a[0]"),
    ({"axes": {"policy": ["vllm"], "d": [{"instances": 2, "hp_instances": 1}]}},
     "axes.d[0].hp_instances:"),
    ({"measure": {"rates": [1.0, 0]}}, "measure.rates[1]:"),
    ({"measure": {"capacity": {"criteria": ["goodput", "p99"]}}},
     "measure.capacity.criteria[1]:"),
    ({"measure": {"capacity": {"target": 1.5}}}, "measure.capacity.target:"),
    ({"measure": {"capacity": {"step": 0.1}}}, "measure.capacity.step: unknown key"),
    ({"measure": {}}, "measure: give rates and/or capacity"),
    ({"options": {"trace": "arxiv"}}, "policy: required"),
    ({"options": {"policy": "vllm"}}, "trace/trace_file: required"),
    ({"extra": 1}, "extra: unknown key"),
])
def test_bad_spec_is_refused_naming_the_key(over: dict[str, Any], key: str) -> None:
    doc = _spec(options={"num_requests": 50, "trace": "sharegpt", "policy": "vllm"},
                axes={})
    doc.update(over)
    with pytest.raises(SpecError) as exc:
        parse_spec(doc, base=Path("/nonexistent"))
    assert str(exc.value).startswith(key), str(exc.value)


def test_bad_spec_file_exits_2_naming_the_key_and_writes_no_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("options: {trace: sharegpt, num_requests: 20}\n"
                    "axes:\n  policy: [vllm, sarathi]\n  slo: [{tbt_slo: 0.1}, {tbt_slo: 0}]\n"
                    "measure: {rates: [1.0]}\n")
    table = tmp_path / "out.jsonl"
    assert main(["sweep", str(spec), "--results", str(table)]) == 2
    assert "axes.slo[1].tbt_slo:" in capsys.readouterr().err
    assert not table.exists()
    spec.write_text("axes: [unclosed\n")
    assert main(["sweep", str(spec), "--results", str(table)]) == 2
    assert "not YAML" in capsys.readouterr().err
    assert not table.exists()


def test_checked_in_capacity_sweep_has_the_issues_sixteen_cells() -> None:
    root = Path(__file__).resolve().parents[2]
    spec = load_spec(root / "infra" / "sweeps" / "capacity16.yaml")
    assert len(spec.cells) == 16
    assert {c.kind for c in spec.cells} == {"capacity"}
    assert len({c.labels["policy"] for c in spec.cells}) == 4
    assert {c.config["num_requests"] for c in spec.cells} == {400}


def test_dry_run_lists_every_cell_and_what_the_table_already_has(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("options: {trace: sharegpt, num_requests: 20}\n"
                    "axes: {policy: [vllm, sarathi]}\nmeasure: {rates: [1.0]}\n")
    cells = load_spec(spec).cells
    table = tmp_path / "s.results.jsonl"  # the default table beside the spec
    table.write_text(f'{{"cell": "{cells[1].hash}", "result": {{}}}}\n')
    assert main(["sweep", str(spec), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{cells[0].hash}  todo  {cells[0].command()}",
                     f"{cells[1].hash}  done  {cells[1].command()}"]


@pytest.mark.parametrize(("argv", "key"), [
    (["sweep", "report", "t.jsonl"], "--out: required"),
    (["sweep", "report", "--out", "d"], "report: give the RESULTS"),
    (["sweep", "report", "--template", "reproduction", "--out", "d"],
     "report --template reproduction: give the folder of its specs"),
    (["sweep", "report", "missing", "--template", "reproduction", "--out", "d"],
     "missing: not a folder"),
    (["sweep", "s.yaml", "--template", "reproduction"], "--template: only with `report`"),
    (["sweep", "s.yaml", "--cells", "zz"], "--cells: 'zz' names 0 cells"),
    (["sweep", "s.yaml", "--costs", "none.jsonl"], "--costs: no such file"),
    (["sweep", "report", "missing.jsonl", "--out", "d"], "RESULTS: no such file"),
    (["sweep", "s.yaml", "t.jsonl"], "RESULTS: only `report`"),
    (["sweep", "missing.yaml"], "missing.yaml: cannot read"),
    (["sweep", "s.yaml", "--ray-address", "127.0.0.1:1"], "--ray-address: nothing answers"),
])
def test_bad_sweep_command_line_exits_2_naming_the_argument(
        argv: list[str], key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("options: {trace: sharegpt, policy: vllm}\n"
                                     "measure: {rates: [1.0]}\n")
    assert main(argv) == 2
    assert key in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not (tmp_path / "s.results.jsonl").exists()


def test_cells_are_submitted_longest_first_by_earlier_cpu_or_estimate(tmp_path: Path) -> None:
    """LPT order (issue 37's speedup): an earlier table's cpu_s when it covers every cell,
    else requests x probes; ties keep the spec's order."""
    spec = parse_spec({"options": {"trace": "sharegpt", "num_requests": 20},
                       "axes": {"policy": ["vllm", "sarathi", "accelgen"],
                                "num_requests": [20, 40]},
                       "measure": {"rates": [1.0], "capacity": {"criteria": ["goodput"]}}})
    cells = list(spec.cells)
    est = longest_first(cells)
    assert [c.kind for c in est[:3]] == ["capacity"] * 3  # 8 probes of 40 requests
    assert [c.config["num_requests"] for c in est] == [40] * 3 + [20] * 3 + [40] * 3 + [20] * 3
    assert est[:3] == [c for c in cells if c.kind == "capacity" and
                       c.config["num_requests"] == 40]  # ties: the spec's order
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps({"cell": c.hash, "cpu_s": float(i)}) + "\n"
                             for i, c in enumerate(cells)))
    assert longest_first(cells, table_costs(table)) == cells[::-1]
    partial = {c.hash: 1.0 for c in cells[1:]}
    assert longest_first(cells, partial) == est  # one cell unknown: the estimate
    with pytest.raises(ValueError, match="--costs: no such file"):
        table_costs(tmp_path / "missing.jsonl")


def test_override_sets_a_knob_on_the_matching_cells_only() -> None:
    """A per-cell knob the cross product cannot say: Ascendra's HP on three instances."""
    spec = parse_spec(_spec(
        axes={"policy": ["vllm", "ascendra"], "instances": [1, 3]},
        measure={"rates": [2.0]},
        overrides=[{"when": {"policy": "ascendra", "instances": 3},
                    "set": {"hp_instances": 1}}]))
    hp = {(c.config["policy"], c.config["instances"]): c.config["hp_instances"]
          for c in spec.cells}
    assert hp == {("vllm", 1): 0, ("vllm", 3): 0, ("ascendra", 1): 0, ("ascendra", 3): 1}
    three = next(c for c in spec.cells if c.config["policy"] == "ascendra"
                 and c.config["instances"] == 3)
    assert "--hp-instances 1" in three.command()


@pytest.mark.parametrize(("rule", "key"), [
    ({"when": {"policy": "ascendra", "instances": "3"}, "set": {"hp_instances": 1}},
     "overrides[0].when: matches no cell"),
    ({"when": {"policy": "ascendra"}, "set": {"hp_instancez": 1}},
     "overrides[0].set.hp_instancez: unknown option"),
    ({"when": {"policy": "ascendra"}}, "overrides[0].set: missing"),
    ({"when": {"policy": "ascendra"}, "set": {"qps": 2.0}}, "overrides[0].set.qps"),
])
def test_bad_override_is_refused_naming_the_key(rule: dict[str, Any], key: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec(_spec(axes={"policy": ["vllm", "ascendra"], "instances": [1, 3]},
                         measure={"rates": [2.0]}, overrides=[rule]))
    assert str(exc.value).startswith(key), str(exc.value)


def test_a_cells_max_drop_share_reaches_its_capacity_search() -> None:
    """``max_drop_share`` is a `capacity` option (issue 38): a cell setting it is searched
    with it, as the command is, not with the default."""
    spec = parse_spec({"options": {"trace": "sharegpt", "num_requests": 30, "policy": "vllm",
                                   "max_drop_share": 0.25},
                       "measure": {"capacity": {"criteria": ["tail"]}}})
    (cell,) = spec.cells
    out = run_cell(cell.kind, list(cell.argv), cell.rel_tol)["result"]
    assert out["max_drop_share"] == 0.25


def test_costs_from_a_table_written_before_an_option_was_added_match_by_command(
        tmp_path: Path) -> None:
    spec = parse_spec({"options": {"trace": "sharegpt", "num_requests": 20},
                       "axes": {"policy": ["vllm", "sarathi", "accelgen"]},
                       "measure": {"capacity": {"criteria": ["goodput"]}}})
    cells = list(spec.cells)
    table = tmp_path / "old.jsonl"  # other hashes (an older config), the same commands
    table.write_text("".join(json.dumps({"cell": f"old{i}", "command": c.command(),
                                         "cpu_s": float(i)}) + "\n"
                             for i, c in enumerate(cells)))
    assert longest_first(cells, table_costs(table)) == cells[::-1]


def test_an_option_at_its_as_before_value_leaves_the_hash_and_any_other_value_changes_it(
) -> None:
    """``prefix_cache_outputs`` came after the checked-in tables: on (every run before it)
    it is left out of a cell's hash, so those tables keep naming their cells; off, the cell
    runs otherwise and is another cell."""
    base = parse_spec(_spec()).cells
    on = parse_spec(_spec(options={"num_requests": 50, "trace": "sharegpt",
                                   "prefix_cache_outputs": True})).cells
    off = parse_spec(_spec(options={"num_requests": 50, "trace": "sharegpt",
                                    "prefix_cache_outputs": False})).cells
    assert all(c.config["prefix_cache_outputs"] is True for c in base)  # still recorded
    # ... but hashed as a table written before the option existed hashed it: without it
    assert [c.hash for c in base] == [
        cell_hash(c.kind, {k: v for k, v in c.config.items() if k != "prefix_cache_outputs"},
                  c.rel_tol) for c in base]
    assert [c.hash for c in on] == [c.hash for c in base]
    assert not {c.hash for c in off} & {c.hash for c in base}
