"""`sloserve simulate` with prefix identity: Mooncake trace files and the multi-turn workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sloserve.services.cli import main


def mooncake(tmp_path: Path) -> Path:
    rows = [{"timestamp": 400 * k, "input_length": 1100, "output_length": 8,
             "hash_ids": [1, 2, 10 + k]} for k in range(30)]  # 1024 tokens in common
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_mooncake_trace_file_shares_its_common_blocks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--policy", "sarathi", "--trace-file", str(mooncake(tmp_path)),
            "--arrival", "trace", "--num-requests", "30", "--qps", "2", "--json"]
    assert main(args) == 0
    on = json.loads(capsys.readouterr().out)
    assert on["completed"] == 30
    assert on["prefix_hit_tokens"] == 29 * 1024  # every request after the first
    assert main([*args, "--no-prefix-caching"]) == 0
    assert "prefix_hit_rate" not in json.loads(capsys.readouterr().out)


def test_a_bad_hash_ids_line_is_a_clear_error_naming_file_and_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = mooncake(tmp_path)
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace('"hash_ids": [1, 2, 13]', '"hash_ids": "abc"')
    path.write_text("\n".join(lines) + "\n")
    assert main(["simulate", "--policy", "sarathi", "--trace-file", str(path),
                 "--num-requests", "5", "--qps", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{path} line 4: hash_ids" in err


def test_multiturn_with_prefix_routing_reports_matches(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "sarathi", "--trace", "multiturn", "--instances", "2",
                 "--num-requests", "80", "--qps", "4", "--prefix-routing", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prefix_routed_to_match"] > 0 and out["prefix_hit_rate"] > 0


def test_no_prefix_cache_outputs_finds_no_earlier_answer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each row's prompt is the previous row's prompt and answer (ids 1..k+2, one per 512
    tokens), sent after it finished: vLLM's caching (the default) finds the earlier answer
    too; --no-prefix-cache-outputs (the live stack's prompt-only identity) finds only the
    earlier prompt's full blocks."""
    unit = 512
    rows = [{"timestamp": 1000 * k, "input_length": (k + 1) * unit + 10,
             "output_length": unit, "hash_ids": list(range(1, k + 3))} for k in range(4)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["simulate", "--policy", "sarathi", "--trace-file", str(path), "--arrival", "trace",
            "--num-requests", "4", "--qps", "0.05", "--json"]  # 20 s apart: each done
    assert main(args) == 0
    # turn k (1..3) finds turn k-1's prompt and answer: k + 1 units
    assert json.loads(capsys.readouterr().out)["prefix_hit_tokens"] == (2 + 3 + 4) * unit
    assert main([*args, "--no-prefix-cache-outputs"]) == 0
    # ... or only its prompt's full blocks: k units (its last 10 tokens fill no block)
    assert json.loads(capsys.readouterr().out)["prefix_hit_tokens"] == (1 + 2 + 3) * unit
