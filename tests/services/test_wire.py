"""The committed wire code (``sloserve.v1``) is exactly what grpcio-tools makes from ``protos/``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_wire_code_matches_the_protos() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "infra" / "gen_protos.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_sdk_imports_without_protoc() -> None:
    code = ("import sys; sys.modules['grpc_tools'] = None; import sloserve.client; "
            "import sloserve.services.proto as p; print(p.SERVICE_NAMES['gateway'])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "sloserve.v1.Gateway"
