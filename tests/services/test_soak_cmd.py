"""``sloserve soak`` end to end, a few seconds long (the 10-minute run is not in CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_a_short_soak_reports_every_request_and_each_process_rss(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # embedded store
    proc = subprocess.run(
        [sys.executable, "-m", "sloserve.services.cli", "soak", "--duration", "4",
         "--capacity", "2.5", "--sample-every", "1", "--out", str(out),
         "--log-dir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["sent"] > 0 and r["completed"] == r["sent"]
    assert r["lost"] == 0 and r["errors"] == {} and r["exited_services"] == []
    assert r["restarts"] == []
    assert r["qps"] == 2.0 and r["capacity_given"] is True
    assert set(r["rss"]) == {"perfmodel", "executor-lp0", "scheduler-lp0", "gateway"}
    assert all(v["rss_last_mb"] > 10 for v in r["rss"].values())
    assert "--duration 4" in r["command"]
