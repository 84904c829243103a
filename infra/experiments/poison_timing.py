"""Where an oversized gRPC request's time goes (docs/reliability.md, poison inputs).

A bare grpc.aio server on loopback (another process) with one unary-stream method;
server variants: gRPC's receive limit of 4 MiB with C-core's tarpit (today's default)
or without it, or a 64 MiB limit with our own check of ``len(raw)`` in the handler
before parsing (INVALID_ARGUMENT). For each message size it reports

* ``client``: a gRPC Python client sending the raw bytes, time to the status (min,
  median, max over RUNS); it includes the client copying the message into gRPC's buffer
  before the first byte leaves;
* ``server``: a frame-level client (``services/sloserve/services/drills/h2.py``) that declares
  the size
  in the gRPC length prefix, sends one 16 KB frame and times the answer, i.e. how long
  the server takes once the message starts (only for variants that refuse at the prefix);
* ``lag``: the worst lateness of a 1 ms ticker on the server's event loop while the
  client calls ran (what every other stream on that loop would have waited);
* ``rss``: the server's RSS after the calls, MB.

    PYTHONPATH=shared:services python infra/experiments/poison_timing.py [VARIANT...]
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[2]

from sloserve.services.drills.h2 import send_oversized  # noqa: E402

MiB = 1 << 20
SIZES = (4 * MiB - 64, 5 * MiB, 17 * MiB, 32 * MiB, 64 * MiB - 64)
RUNS = 5
METHOD = "/t.T/G"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _server(port: int, opts: list[tuple[str, int]], check: int, ready: Any) -> None:
    async def main() -> None:
        lag = [0.0]

        async def ticker() -> None:
            while True:
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                lag[0] = max(lag[0], time.perf_counter() - t - 0.001)

        async def handler(raw: bytes, ctx: grpc.aio.ServicerContext) -> Any:
            if check and len(raw) > check:
                await ctx.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"request: {len(raw)} bytes, at most {check}")
            yield b"ok"

        async def stats(raw: bytes, ctx: grpc.aio.ServicerContext) -> bytes:
            out = json.dumps({"lag_ms": round(lag[0] * 1e3, 1), "rss_mb": round(_rss_mb(), 1)})
            lag[0] = 0.0
            return out.encode()

        h = grpc.method_handlers_generic_handler("t.T", {
            "G": grpc.unary_stream_rpc_method_handler(handler, lambda b: b, lambda b: b),
            "S": grpc.unary_unary_rpc_method_handler(stats, lambda b: b, lambda b: b)})
        server = grpc.aio.server(options=opts)
        server.add_generic_rpc_handlers((h,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        task = asyncio.create_task(ticker())
        ready.set()
        await server.wait_for_termination()
        task.cancel()

    asyncio.run(main())


def _spread(ts: list[float]) -> list[float]:
    return [round(min(ts), 1), round(statistics.median(ts), 1), round(max(ts), 1)]


def _measure(port: int, refuses_at_prefix: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}",
                               options=[("grpc.max_send_message_length", 128 * MiB)]) as ch:
        call = ch.unary_stream(METHOD, request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
        stats = ch.unary_unary("/t.T/S", request_serializer=lambda b: b,
                               response_deserializer=json.loads)
        list(call(b"warm", timeout=10))
        out["rss_mb_before"] = stats(b"", timeout=10)["rss_mb"]
        for size in SIZES:
            ts = []
            code = ""
            for _ in range(RUNS):
                raw = b"r" * size
                t0 = time.perf_counter()
                try:
                    list(call(raw, timeout=30))
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                ts.append((time.perf_counter() - t0) * 1e3)
                del raw
            row: dict[str, Any] = {"code": code, "client_ms": _spread(ts)}
            row.update(stats(b"", timeout=10))
            if refuses_at_prefix and size > 4 * MiB:
                server = [send_oversized("127.0.0.1", port, METHOD, size) for _ in range(RUNS)]
                row["server_ms"] = _spread([r.seconds * 1e3 for r in server])
                row["server_frames"] = list(server[-1].frames)
            out[f"{size / MiB:.0f} MiB"] = row
    return out


BIG = 64 * MiB
LIMIT = [("grpc.max_receive_message_length", 4 * MiB)]
# name: (server options, handler's own limit (0: none), refuses at the length prefix)
VARIANTS: dict[str, tuple[list[tuple[str, int]], int, bool]] = {
    "4 MiB gRPC limit, tarpit on (gRPC's default)": (LIMIT, 0, True),
    "4 MiB gRPC limit, tarpit off (the gateway now)": (LIMIT + [("grpc.http.tarpit", 0)], 0, True),
    "64 MiB gRPC limit, handler checks len(raw) > 4 MiB": (
        [("grpc.max_receive_message_length", BIG)], 4 * MiB, False),
    "4 MiB, tarpit on, lookahead 64 MiB": (LIMIT + [("grpc.http2.lookahead_bytes", BIG)], 0, True),
    "4 MiB, tarpit on, BDP probe off": (LIMIT + [("grpc.http2.bdp_probe", 0)], 0, True),
}


def main() -> None:
    only = sys.argv[1:]
    res: dict[str, Any] = {"loadavg_before": os.getloadavg(), "grpc": grpc.__version__,
                           "runs": RUNS, "spread": "min, median, max"}
    base = int(os.environ.get("POISON_PORT", "20111"))
    for i, (name, (opts, check, at_prefix)) in enumerate(VARIANTS.items()):
        if only and not any(o in name for o in only):
            continue
        ready = mp.Event()
        p = mp.Process(target=_server, args=(base + i, opts, check, ready), daemon=True)
        p.start()
        ready.wait(10)
        try:
            res[name] = _measure(base + i, at_prefix)
        finally:
            p.kill()
            p.join()
        print(name, json.dumps(res[name]), flush=True)
    res["loadavg_after"] = os.getloadavg()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
