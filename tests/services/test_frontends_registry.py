"""``up --frontends 2`` follows the instance registry (issue 33's seam, issue 34 item 2): the
router reads the registry in Redis as the one gateway does and tells both frontends of each
join and leave on its stream. A scheduler started after ``up`` joins and is served through
both frontends; SIGTERMed, it deregisters and drains, and its streams are re-run on the
others, whole and in order. After a whole-stack stop or crash, the requests each scheduler
holds reach a frontend (the first to connect adopts them and tells the router) and resume
there. Sim backend, real Redis, real processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest

from sloserve.client import Client
from sloserve.services.drills.faults import wait_event
from sloserve.services.drills.restart import Outcome, attach_all, drill
from sloserve.services.executor.backends import pseudo_token
from sloserve.services.proto import SERVICE_NAMES, gateway_grpc, gateway_pb2
from sloserve.services.stack import Service, Stack

FRONTENDS = ("gateway", "gateway-1")
LATE = "lp2"
# output tokens of a re-attach test's requests: still running when their clients come back
LONG = 400
SHORT, ENDED_WAIT_S = 40, 6.0  # requests that end (well within the wait) before re-attach


def own_connection(target: str) -> tuple[grpc.Channel, gateway_grpc.GatewayStub]:
    """A channel with its own TCP connection (gRPC shares one per target by default): the
    kernel spreads new connections over the frontends (SO_REUSEPORT)."""
    ch = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    return ch, gateway_grpc.GatewayStub(ch)


def served_on(stack: Stack, frontend: str, instance: str) -> float:
    """Requests ``frontend`` finished on ``instance`` (vllm:request_success_total)."""
    text = httpx.get(f"http://{stack.services[frontend].metrics}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total")
               and f'engine="{instance}"' in line)


def events(log: Path, name: str) -> list[dict[str, object]]:
    """The JSON log lines of ``log`` whose event is ``name``."""
    lines = (json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{"))
    return [e for e in lines if e.get("event") == name]


def _swap(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def start_late_instance(stack: Stack) -> None:
    """An executor + scheduler like ``lp1``'s (same Deployment, prefix, Redis, token) on
    fresh ports as instance ``lp2``: nobody is told of it but the registry."""
    ex, sc = stack.services["executor-lp1"], stack.services["scheduler-lp1"]
    host = ex.address.rpartition(":")[0]
    pe, ps = stack._port(host), stack._port(host)
    ex_argv = _swap(_swap(ex.argv, "--port", str(pe)), "--instance", "2")
    sc_argv = _swap(_swap(_swap(sc.argv, "--port", str(ps)), "--instance-id", LATE),
                    "--executor", f"{host}:{pe}")
    if "--metrics-port" in ex_argv:  # each its own /metrics port
        ex_argv = _swap(ex_argv, "--metrics-port", str(stack._port(host)))
        sc_argv = _swap(sc_argv, "--metrics-port", str(stack._port(host)))
    stack.services[f"executor-{LATE}"] = Service(
        f"executor-{LATE}", ex_argv, f"{host}:{pe}", SERVICE_NAMES["executor"])
    stack.services[f"scheduler-{LATE}"] = Service(
        f"scheduler-{LATE}", sc_argv, f"{host}:{ps}", SERVICE_NAMES["scheduler"])
    stack.spawn(f"executor-{LATE}")
    stack.spawn(f"scheduler-{LATE}")


def test_two_frontends_take_a_late_scheduler_from_the_registry_and_drain_it_on_sigterm(
    start_stack: Callable[..., Stack], tmp_path: Path,
) -> None:
    stack = start_stack(policy="sarathi", instances=2, frontends=2, metrics=True)
    logs = stack.cfg.log_dir
    assert logs is not None
    t0 = time.monotonic()
    start_late_instance(stack)
    joined = wait_event(logs / "router.log", "instance_joined", 0, 90)
    assert joined["instance"] == LATE
    for fe in FRONTENDS:  # each opened its own stream to it, from the router's news
        assert wait_event(logs / f"{fe}.log", "instance_joined", 0, 10)["instance"] == LATE
    join_s = time.monotonic() - t0

    # round-robin over lp0, lp1, lp2: requests on fresh connections until each frontend
    # has finished one on the late instance
    sent = 0
    while sent < 60 and not all(served_on(stack, fe, LATE) > 0 for fe in FRONTENDS):
        ch, stub = own_connection(stack.gateway)
        req = gateway_pb2.GenerateRequest(prompt_token_ids=[70 + sent % 20] * 24,
                                          max_tokens=4, request_id=f"j-{sent}")
        assert len(list(stub.Generate(req, timeout=60))) == 4
        ch.close()
        sent += 1
    on_late = {fe: served_on(stack, fe, LATE) for fe in FRONTENDS}
    assert all(n > 0 for n in on_late.values()), (sent, on_late)

    # streams over both frontends, then SIGTERM the late scheduler mid-stream
    n, max_tokens = 12, 300
    conns = [own_connection(stack.gateway) for _ in range(n)]
    chunks: dict[int, list[gateway_pb2.GenerateChunk]] = {}
    errors: list[BaseException] = []
    started = threading.Barrier(n + 1)

    def one(k: int) -> None:
        got: list[gateway_pb2.GenerateChunk] = []
        try:
            req = gateway_pb2.GenerateRequest(
                prompt_token_ids=[66 + k] * (30 + 5 * k), max_tokens=max_tokens,
                ttft_slo=60.0, tbt_slo=60.0, request_id=f"leave-{k}")
            for c in conns[k][1].Generate(req, timeout=180):
                if not got:
                    started.wait(timeout=60)
                got.append(c)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        chunks[k] = got

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    started.wait(timeout=60)  # every stream has its first token
    sched = stack.services[f"scheduler-{LATE}"].proc
    assert sched is not None
    t_stop = time.monotonic()
    sched.send_signal(signal.SIGTERM)
    left = wait_event(logs / "router.log", "instance_left", 0, 30)
    code = sched.wait(timeout=40)
    exit_s = time.monotonic() - t_stop
    for t in threads:
        t.join(timeout=180)
    for ch, _ in conns:
        ch.close()

    assert not errors, errors[:3]
    assert left["instance"] == LATE and left["reason"] == "deregistered"
    for fe in FRONTENDS:  # each closed its stream to it, from the router's news
        assert wait_event(logs / f"{fe}.log", "instance_left", 0, 10)["instance"] == LATE
    on_it = [k for k, c in chunks.items() if c[0].instance_id == LATE]
    assert on_it, "no stream started on the late instance"
    for k, got in chunks.items():  # every stream whole, in order, exactly once
        rid = f"leave-{k}"
        assert [c.index for c in got] == list(range(max_tokens)), k
        assert [c.token_id for c in got] == [pseudo_token(rid, i) for i in range(max_tokens)]
    moved = [k for k in on_it if chunks[k][-1].instance_id != LATE]
    assert moved == on_it, (on_it, moved)  # each re-run elsewhere before its end
    drained = wait_event(logs / f"scheduler-{LATE}.log", "drained", 0, 5)
    assert code == 0 and drained["left"] == 0, drained
    print(f"\nfrontends+registry: {LATE} joined both frontends {join_s:.1f} s after its "
          f"processes started; {sent} requests until each frontend served one there "
          f"({on_late}); {len(moved)}/{len(on_it)} streams on it re-run elsewhere, 12/12 "
          f"whole; scheduler exit {exit_s:.2f} s after SIGTERM; load {os.getloadavg()[0]:.2f}")
    stack.services[f"executor-{LATE}"].proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "crash"])
def test_after_a_whole_stack_restart_each_restored_request_resumes_at_its_adopting_frontend(
    start_stack: Callable[..., Stack], sig: int,
) -> None:
    stack = start_stack(policy="sarathi", instances=2, frontends=2, time_scale=2.0)
    logs = stack.cfg.log_dir
    assert logs is not None
    adopter: dict[str, str] = {}

    def at_the_adopter(s: Stack, outcomes: list[Outcome], max_tokens: int) -> None:
        """Each client re-attaches at the frontend whose log says it adopted its request
        (each frontend also listens alone on its private port)."""
        deadline = time.monotonic() + 30.0  # the schedulers' offers reach the frontends
        while True:  # as they connect: read the logs until every request is adopted
            adopter.clear()
            for fe in FRONTENDS:
                for e in events(logs / f"{fe}.log", "request_restored"):
                    assert str(e["request_id"]) not in adopter, e  # adopted once, by one
                    adopter[str(e["request_id"])] = fe
            if len(adopter) >= len(outcomes) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for fe in FRONTENDS:
            client = Client(s.services[fe].address)
            attach_all(client, [o for o in outcomes if adopter.get(o.request_id) == fe],
                       max_tokens, deadline_s=60)
            client.close()

    outcomes, down = drill(stack, 8, 150, sig, reattach=at_the_adopter)
    assert sorted(adopter) == sorted(o.request_id for o in outcomes), adopter
    assert all(0 < o.before < 150 for o in outcomes)  # every one cut mid-stream
    assert [o.row() for o in outcomes if not o.resumed] == []
    print(f"\nfrontends restart ({signal.Signals(sig).name}): down {down:.1f} s; adopted "
          f"{sorted(adopter.values())}; 8/8 resumed; load {os.getloadavg()[0]:.2f}")


def test_after_a_whole_stack_crash_a_client_re_attaches_through_the_other_frontend(
    start_stack: Callable[..., Stack],
) -> None:
    """Each client re-attaches at the frontend that did NOT adopt its request (as the
    kernel may pick): that frontend asks the router, the adopter hands the request over
    (it had no client), the asker claims it on the scheduler and streams the rest, every
    token exact and in order; neither frontend answers NOT_FOUND."""
    stack = start_stack(policy="sarathi", instances=2, frontends=2, time_scale=2.0)
    logs = stack.cfg.log_dir
    assert logs is not None
    adopter: dict[str, str] = {}

    def at_the_other(s: Stack, outcomes: list[Outcome], max_tokens: int) -> None:
        time.sleep(1.0)  # the schedulers' offers reach the frontends as they connect
        for fe in FRONTENDS:
            for e in events(logs / f"{fe}.log", "request_restored"):
                adopter[str(e["request_id"])] = fe
        clients = {fe: Client(s.services[fe].address) for fe in FRONTENDS}
        # every client at once, while its request still runs (one that ended unattached
        # stays on its adopter: not yet handed over, docs/architecture.md "Not yet")
        threads = [threading.Thread(target=attach_all, args=(
            clients[fe], [o for o in outcomes if adopter.get(o.request_id) not in (None, fe)],
            max_tokens), kwargs={"deadline_s": 60}) for fe in FRONTENDS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for c in clients.values():
            c.close()

    outcomes, down = drill(stack, 8, LONG, signal.SIGKILL, reattach=at_the_other)
    assert sorted(adopter) == sorted(o.request_id for o in outcomes), adopter
    assert all(0 < o.before < LONG for o in outcomes)  # every one cut mid-stream
    assert [o.row() for o in outcomes if not o.resumed] == []
    handed = {str(e["request_id"]).rpartition("/")[2]: fe for fe in FRONTENDS
              for e in events(logs / f"{fe}.log", "request_handed_over")}
    taken = {str(e["request_id"]).rpartition("/")[2]: fe for fe in FRONTENDS
             for e in events(logs / f"{fe}.log", "request_taken_over")}
    for o in outcomes:
        rid = o.request_id.rpartition("/")[2]
        assert handed.get(rid) == adopter[o.request_id] != taken.get(rid), (rid, handed, taken)
    print(f"\nre-attach through the other frontend: down {down:.1f} s; 8/8 resumed, each "
          f"handed over once; load {os.getloadavg()[0]:.2f}")


def test_a_request_that_ended_unattached_is_replayed_through_the_other_frontend(
    start_stack: Callable[..., Stack],
) -> None:
    """After a whole-stack crash the restored requests run to their end before any
    client comes back; each client then re-attaches through the frontend that did not
    adopt its request: the adopter hands over what it kept (every token, nothing runs)
    and the other frontend replays it, exact, to its end."""
    stack = start_stack(policy="sarathi", instances=2, frontends=2, time_scale=2.0)
    logs = stack.cfg.log_dir
    assert logs is not None
    adopter: dict[str, str] = {}

    def after_the_end(s: Stack, outcomes: list[Outcome], max_tokens: int) -> None:
        time.sleep(ENDED_WAIT_S)  # the restored requests end, unattached, at the adopter
        for fe in FRONTENDS:
            for e in events(logs / f"{fe}.log", "request_restored"):
                adopter[str(e["request_id"])] = fe
        for fe in FRONTENDS:
            client = Client(s.services[fe].address)
            attach_all(client, [o for o in outcomes if adopter.get(o.request_id) not in
                                (None, fe)], max_tokens, deadline_s=60)
            client.close()

    outcomes, _ = drill(stack, 8, SHORT, signal.SIGKILL, prefix="ended", reattach=after_the_end)
    assert sorted(adopter) == sorted(o.request_id for o in outcomes), adopter
    assert [o.row() for o in outcomes if not o.resumed] == []
    handed = [e for fe in FRONTENDS for e in events(logs / f"{fe}.log", "request_handed_over")]
    assert len(handed) == 8 and all(e["ended"] for e in handed), handed
    print(f"\nended-unattached re-attach through the other frontend: 8/8 replayed whole; "
          f"load {os.getloadavg()[0]:.2f}")


def test_after_a_whole_stack_crash_http_clients_re_attach_on_the_shared_port(
    start_stack: Callable[..., Stack],
) -> None:
    """``GET /v1/completions/{id}?stream=true&starting_after=N`` on the port both frontends
    share, a new connection each (the kernel picks the frontend): every stream's rest comes
    back whole, whichever frontend adopted it; at least one went through the other one
    (8 connections, each landing on either: all 8 on the adopter has odds of 1/256)."""
    from sloserve.services.store import free_port

    stack = start_stack(policy="sarathi", instances=2, frontends=2, time_scale=2.0,
                        http_port=free_port())
    logs = stack.cfg.log_dir
    assert logs is not None

    def over_http(s: Stack, outcomes: list[Outcome], max_tokens: int) -> None:
        threads = [threading.Thread(target=one, args=(s, o)) for o in outcomes]
        for t in threads:  # every client at once, while its request still runs
            t.start()
        for t in threads:
            t.join(timeout=180)

    def one(s: Stack, o: Outcome) -> None:
        url = f"{s.http}/v1/completions/cmpl-{o.request_id}"
        params = {"starting_after": str(o.before - 1), "stream": "true"}
        for _ in range(100):  # 503 while a frontend reconnects to its instances
            r = httpx.get(url, params=params, timeout=120)  # a new connection each
            if r.status_code != 503:
                break
            time.sleep(0.1)
        chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
        o.after = len(chunks)
        o.resumed = (r.status_code == 200 and bool(chunks)
                     and r.text.rstrip().endswith("data: [DONE]")
                     and chunks[-1]["choices"][0]["finish_reason"] == "length")
        if not o.resumed:
            o.status = f"HTTP {r.status_code}: {r.text[-200:]}"

    outcomes, down = drill(stack, 8, LONG, signal.SIGKILL, prefix="http", reattach=over_http)
    assert [o.row() for o in outcomes if not o.resumed] == []
    taken = [e for fe in FRONTENDS for e in events(logs / f"{fe}.log", "request_taken_over")]
    assert taken, "every connection landed on the adopting frontend (odds 1/256): rerun"
    print(f"\nHTTP re-attach on the shared port: down {down:.1f} s; 8/8 resumed, "
          f"{len(taken)} through the other frontend; load {os.getloadavg()[0]:.2f}")


def test_a_frontend_given_a_scheduler_list_is_refused_naming_the_flag() -> None:
    """A frontend's instances are the router's news: ``--scheduler`` belongs to the router
    (or the one gateway); given to a frontend it fails at once, naming the flag."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "sloserve.services.frontend", "--port", "0", "--router",
         "127.0.0.1:1", "--scheduler", "lp0=127.0.0.1:2"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--scheduler: a frontend takes its instances from the router" in done.stderr, \
        done.stderr[-2000:]
