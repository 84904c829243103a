"""Latency of refused and accepted calls on a keyed live stack (docs/reliability.md).

    PYTHONPATH=shared:services python infra/experiments/auth_latency.py
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from sloserve.services.proto import gateway_grpc, gateway_pb2, scheduler_grpc, scheduler_pb2
from sloserve.services.stack import Stack, StackConfig
from sloserve.services.store import free_port

RUNS = 30


def _ms(call: Callable[[], object]) -> list[float]:
    ts = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        try:
            call()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
        ts.append((time.perf_counter() - t0) * 1e3)
    return [round(min(ts), 2), round(statistics.median(ts), 2), round(max(ts), 2)]


def main() -> None:
    d = Path(tempfile.mkdtemp())
    (d / "k").write_text("good-key\n")
    st = Stack(StackConfig(gateway_port=free_port(), log_dir=d, api_key_file=str(d / "k")))
    st.start()
    out: dict[str, object] = {}
    try:
        req = gateway_pb2.GenerateRequest(prompt="hi", max_tokens=2)
        with grpc.insecure_channel(st.gateway) as ch:
            gw = gateway_grpc.GatewayStub(ch)
            for label, md in (("none", ()), ("wrong", (("authorization", "Bearer bad"),)),
                              ("valid_2tok", (("authorization", "Bearer good-key"),))):
                def generate(md: tuple[tuple[str, str], ...] = md) -> object:
                    return list(gw.Generate(req, metadata=md))
                out[f"gateway_{label}_ms"] = _ms(generate)
        hello = scheduler_pb2.SchedulerInput(hello=scheduler_pb2.Hello(gateway_id="rogue"))
        with grpc.insecure_channel(st.services["scheduler-lp0"].address) as ch:
            s = scheduler_grpc.SchedulerStub(ch)
            out["scheduler_rogue_connect_ms"] = _ms(
                lambda: list(s.Connect(iter([hello]), timeout=5)))
    finally:
        st.stop()
    out.update(min_median_max=True, runs_each=RUNS, loadavg=os.getloadavg())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
