"""Client faults on a live stack (issue 36, items 1 and 2; docs/reliability.md's table):
a lone surrogate over HTTP (and invalid UTF-8 over gRPC), and clients that go mid-request.

Sim backend, `sarathi`, 2 instances, loopback, batches at 8x their profiled time (a 6000-
token prefill lasts seconds). Appends one JSON line per run to
``docs/results/client_faults.jsonl``:

    PYTHONPATH=shared:services python infra/experiments/client_faults.py

* surrogate: ``he\\ud800llo`` in ``prompt``, chat ``content`` and ``stop``: status, param,
  latency, whether the keep-alive connection served the next request;
* non-streamed disconnect: 5 requests of 3000 tokens closed after 1 s: seconds from the
  close until the gateway's in-flight count (``sloserve:gateway_requests_running``) is 0
  and the schedulers hold no request and no KV block; the same for 5 SSE streams closed
  before their first token (6000-token prompts) and after it.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx

from sloserve.services.proto import gateway_pb2, scheduler_grpc, scheduler_pb2
from sloserve.services.stack import Stack, StackConfig
from sloserve.services.store import free_port

OUT = Path(__file__).resolve().parents[2] / "docs" / "results" / "client_faults.jsonl"
N = 5


def held(st: Stack) -> dict[str, int]:
    out = {"requests": 0, "kv_blocks": 0}
    for name, svc in st.services.items():
        if name.startswith("scheduler"):
            with grpc.insecure_channel(svc.address) as ch:
                s = scheduler_grpc.SchedulerStub(ch).Status(
                    scheduler_pb2.StatusRequest(), metadata=st.internal_metadata, timeout=5)
            out["requests"] += s.num_running + s.num_waiting
            out["kv_blocks"] += s.executor.kv_capacity_blocks - s.kv_free_blocks
    text = httpx.get(f"http://{st.services['gateway'].metrics}/metrics", timeout=5).text
    for ln in text.splitlines():
        for g in ("running", "waiting"):
            if ln.startswith(f"sloserve:gateway_requests_{g}{{"):
                out[g] = int(float(ln.rsplit(" ", 1)[1]))
    return out


def until(st: Stack, ok: Callable[[dict[str, int]], bool], timeout: float = 120) -> float:
    t0 = time.monotonic()
    while not ok(held(st)):
        if time.monotonic() - t0 > timeout:
            return float("inf")
        time.sleep(0.01)
    return time.monotonic() - t0


def post(st: Stack, body: dict[str, object]) -> socket.socket:
    host, _, port = st.http.removeprefix("http://").partition(":")
    raw = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: p\r\ncontent-type: application/json\r\n"
              b"content-length: %d\r\n\r\n%s" % (len(raw), raw))
    return s


def surrogates(st: Stack) -> dict[str, object]:
    host, _, port = st.http.removeprefix("http://").partition(":")
    cases = {
        "prompt": ("/v1/completions", '{"prompt": "he\\ud800llo", "max_tokens": 2}'),
        "chat_content": ("/v1/chat/completions", '{"messages": [{"role": "user", '
                         '"content": "he\\ud800llo"}], "max_tokens": 2}'),
        "stop": ("/v1/completions", '{"prompt": "hello", "stop": ["he\\ud800llo"], '
                 '"max_tokens": 2}'),
    }
    out: dict[str, object] = {}
    for name, (path, raw) in cases.items():
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        t0 = time.perf_counter()
        conn.request("POST", path, raw.encode(), {"content-type": "application/json"})
        r = conn.getresponse()
        err = json.loads(r.read())["error"]
        ms = (time.perf_counter() - t0) * 1e3
        sock = conn.sock
        conn.request("POST", "/v1/completions", b'{"prompt": "hello", "max_tokens": 2}',
                     {"content-type": "application/json"})
        nxt = conn.getresponse()
        nxt.read()
        out[name] = {"status": r.status, "param": err["param"], "message": err["message"],
                     "ms": round(ms, 2), "next_on_same_connection": nxt.status,
                     "kept": conn.sock is sock}
        conn.close()
    msg = gateway_pb2.GenerateRequest(prompt="heXXXllo", max_tokens=2).SerializeToString()
    with grpc.insecure_channel(st.gateway) as ch:
        call = ch.unary_stream("/sloserve.v1.Gateway/Generate", request_serializer=lambda b: b,
                               response_deserializer=gateway_pb2.GenerateChunk.FromString)
        t0 = time.perf_counter()
        try:
            list(call(msg.replace(b"XXX", b"\xed\xa0\x80"), timeout=10))
            out["grpc"] = "served"
        except grpc.RpcError as exc:
            out["grpc"] = {"code": exc.code().name, "details": exc.details(),
                           "ms": round((time.perf_counter() - t0) * 1e3, 2)}
    return out


def disconnects(st: Stack, stream: bool, before_first: bool) -> dict[str, object]:
    until(st, lambda h: h["requests"] == h["kv_blocks"] == 0)
    body: dict[str, object] = {
        "prompt": "a" * (6000 if before_first else 8), "max_tokens": 2000 if before_first
        else 3000, "stream": stream, "ignore_eos": True, "ttft_slo_ms": 600_000}
    socks = [post(st, body) for _ in range(N)]
    if before_first:
        until(st, lambda h: h["kv_blocks"] > 0 and h["requests"] == N)
    else:
        time.sleep(1.0)
    at_close = held(st)
    for s in socks:
        s.close()
    freed = until(st, lambda h: not any(h.values()))
    return {"requests": N, "stream": stream, "before_first_token": before_first,
            "held_at_close": at_close, "freed_s": round(freed, 3)}


def main() -> None:
    d = Path(tempfile.mkdtemp())
    st = Stack(StackConfig(instances=2, gateway_port=free_port(), http_port=free_port(),
                           log_dir=d, time_scale=8.0, metrics=True))
    st.start()
    out: dict[str, object] = {"loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    try:
        out["surrogate"] = surrogates(st)
        out["non_streamed_after_1s"] = disconnects(st, stream=False, before_first=False)
        out["sse_before_first_token"] = disconnects(st, stream=True, before_first=True)
        out["non_streamed_before_first_token"] = disconnects(st, stream=False,
                                                             before_first=True)
    finally:
        st.stop()
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    line = json.dumps(out)
    print(line)
    with OUT.open("a") as fh:
        fh.write(line + "\n")


if __name__ == "__main__":
    main()
