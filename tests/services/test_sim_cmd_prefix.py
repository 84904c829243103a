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
