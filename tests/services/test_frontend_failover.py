"""SIGKILL of one of two frontends (issue 33, item 5): only its own streams fail, at once and
with UNAVAILABLE; the other frontend's complete exactly; a new connection is served within
1 s; the supervisor restarts the dead one. Sim backend, real Redis, real processes."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import grpc

from sloserve.services.executor.backends import pseudo_token
from sloserve.services.proto import gateway_grpc, gateway_pb2
from sloserve.services.stack import Stack
from sloserve.services.supervisor import Policy, Supervisor


def own_connection(target: str) -> tuple[grpc.Channel, gateway_grpc.GatewayStub]:
    """A channel with its own TCP connection (gRPC shares one per target by default)."""
    ch = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    return ch, gateway_grpc.GatewayStub(ch)


def test_a_sigkilled_frontend_loses_only_its_streams_and_is_restarted(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi", instances=2, frontends=2)
    supervisor = Supervisor(stack, Policy(unhealthy_s=10.0), say=lambda _: None).start()
    n_conns, per_conn, max_tokens = 10, 5, 150
    conns = [own_connection(stack.gateway) for _ in range(n_conns)]
    chunks: dict[int, list[gateway_pb2.GenerateChunk]] = {}
    failed: dict[int, tuple[grpc.StatusCode, float]] = {}
    started = threading.Barrier(n_conns * per_conn + 1)

    def one(k: int) -> None:
        got: list[gateway_pb2.GenerateChunk] = []
        try:
            req = gateway_pb2.GenerateRequest(
                prompt_token_ids=[66 + k % 30] * (30 + 3 * k),
                max_tokens=max_tokens,
                ttft_slo=60.0,
                tbt_slo=60.0,
                request_id=f"kill-{k}",
            )
            for c in conns[k % n_conns][1].Generate(req, timeout=180):
                if not got:
                    started.wait(timeout=60)
                got.append(c)
        except grpc.RpcError as exc:
            failed[k] = (exc.code(), time.monotonic())
        chunks[k] = got

    try:
        threads = [threading.Thread(target=one, args=(k,)) for k in range(n_conns * per_conn)]
        for t in threads:
            t.start()
        started.wait(timeout=60)  # every stream has its first token
        proc = stack.services["gateway-1"].proc
        assert proc is not None
        killed_pid = proc.pid
        proc.send_signal(signal.SIGKILL)
        killed, killed_at = time.monotonic(), time.time()
        proc.wait(timeout=5)  # gone: its listening sockets are closed (a connection that
        # raced into the dying one's accept queue is reset; a client's retry lands here)
        ch, stub = own_connection(stack.gateway)  # a new connection, right after
        fresh = []
        for c in stub.Generate(
            gateway_pb2.GenerateRequest(
                prompt_token_ids=[90] * 20, max_tokens=4, request_id="after-kill"
            ),
            timeout=10,
        ):
            if not fresh:
                fresh_s = time.monotonic() - killed  # served: its first token is here
            fresh.append(c)
        ch.close()
        for t in threads:
            t.join(timeout=240)
        # the supervisor brings it back
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(
            r.service == "gateway-1" and r.serving_at for r in supervisor.restarts
        ):
            time.sleep(0.5)
    finally:
        supervisor.stop()
        for c, _ in conns:
            c.close()

    assert len(fresh) == 4, fresh
    assert fresh_s < 1.0, (fresh_s, fresh[0].arrival_time - killed_at)
    assert failed, "no stream failed: the killed frontend served none"
    lost_conns = {k % n_conns for k in failed}
    assert len(lost_conns) < n_conns  # some connections were on the survivor
    for k in range(n_conns * per_conn):
        if k % n_conns in lost_conns:  # its connection was the dead frontend's: all fail
            code, at = failed[k]
            assert code == grpc.StatusCode.UNAVAILABLE and at - killed < 1.0, (k, code)
        else:
            assert k not in failed, (k, failed.get(k))
            rid = f"kill-{k}"
            assert [c.token_id for c in chunks[k]] == [
                pseudo_token(rid, i) for i in range(max_tokens)
            ], k
            assert chunks[k][-1].finish_reason == "length"
    back = [r for r in supervisor.restarts if r.service == "gateway-1"]
    assert back and back[0].serving_at is not None and back[0].pid != killed_pid, back
