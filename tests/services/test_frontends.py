"""``up --frontends 2`` (issue 33, items 1-2): two frontend processes share the public gRPC
and HTTP ports (SO_REUSEPORT) and a router holds the one Controller. Sim backend, real
Redis, real processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest

from sloserve.services.drills.openai_burst import burst, expected_text
from sloserve.services.proto import gateway_grpc, gateway_pb2
from sloserve.services.stack import Stack
from sloserve.services.store import free_port

FRONTENDS = ("gateway", "gateway-1")


def own_connection(target: str) -> tuple[grpc.Channel, gateway_grpc.GatewayStub]:
    """A channel with a TCP connection of its own (gRPC shares one between channels to the
    same target by default: they would all land on one frontend)."""
    ch = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    return ch, gateway_grpc.GatewayStub(ch)


def served(stack: Stack, name: str) -> float:
    """Requests a frontend finished (its vllm:request_success_total, every label)."""
    text = httpx.get(f"http://{stack.services[name].metrics}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def test_two_frontends_serve_a_300_request_openai_burst_exactly_and_both_take_requests(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(
        policy="sarathi", instances=2, frontends=2, http_port=free_port(), metrics=True
    )
    n, max_tokens = 300, 24
    out = asyncio.run(burst(stack.http, n, max_tokens, connections=32, prefix="fe"))
    assert not out.errors, list(out.errors.items())[:3]
    assert len(out.texts) == n
    for rid, text in out.texts.items():
        assert text == expected_text(rid, max_tokens), rid
        assert out.finish[rid] == "length" and out.tokens[rid] == max_tokens, rid
    counts = {name: served(stack, name) for name in FRONTENDS}
    assert all(c > 0 for c in counts.values()), counts
    assert sum(counts.values()) == n, counts


def _ticket_intervals(
    decisions: list[dict[str, object]], first_token: dict[str, float], hp: str
) -> list[tuple[float, float, str]]:
    """Each ticketed request's time on the HP before its first token: from the router's
    dispatch to the first token's production (the scheduler's clock, same machine)."""
    return sorted(
        (float(str(d["time"])), first_token[str(d["request"])], str(d["request"]))
        for d in decisions
        if d.get("cause") == "ticket" and d["instance"] == hp
    )


def test_ascendra_2l1h_through_two_frontends_one_ticket_at_a_time_and_round_robin(
    start_stack: Callable[..., Stack],
    tmp_path: Path,
) -> None:
    stack = start_stack(
        policy="ascendra",
        instances=3,
        hp_instances=1,
        frontends=2,
        metrics=True,
        decision_dir=tmp_path,
    )
    n, conns = 60, [own_connection(stack.gateway) for _ in range(8)]
    results: dict[str, list[gateway_pb2.GenerateChunk]] = {}
    errors: list[BaseException] = []

    def one(k: int) -> None:
        try:
            rid = f"burst-{k}"
            req = gateway_pb2.GenerateRequest(
                prompt_token_ids=[70 + k % 20] * (100 + 37 * (k % 9)),
                max_tokens=16,
                ttft_slo=60.0,
                tbt_slo=60.0,
                request_id=rid,
            )
            results[rid] = list(conns[k % len(conns)][1].Generate(req, timeout=120))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    for ch, _ in conns:
        ch.close()
    assert not errors, errors[:3]
    assert len(results) == n and all(len(c) == 16 for c in results.values())
    assert all(served(stack, name) > 0 for name in FRONTENDS)  # the burst went through both

    decisions = [json.loads(line) for line in (tmp_path / "router.jsonl").read_text().splitlines()]
    first_token = {rid: chunks[0].produced_time for rid, chunks in results.items()}
    tickets = _ticket_intervals(decisions, first_token, "hp2")
    assert len(tickets) >= 2, f"tickets: {tickets}"  # else there is nothing to overlap
    for (_, end, rid), (start, _, nxt) in zip(tickets, tickets[1:]):
        assert start >= end, (
            f"{nxt} got the HP's ticket at {start} before {rid}'s first token at {end}"
        )
    routed = Counter(str(d["instance"]) for d in decisions if d.get("cause") == "route")
    assert set(routed) == {"lp0", "lp1"}, routed
    assert abs(routed["lp0"] - routed["lp1"]) <= 1, routed
    assert sum(routed.values()) + len(tickets) == n


def test_frontends_must_be_a_positive_integer_and_refuse_the_virtual_clock() -> None:
    from sloserve.services.stack import StackConfig

    for bad in (0, -1, 1.5, True):
        try:
            StackConfig(frontends=bad).validate()  # type: ignore[arg-type]
        except ValueError as exc:
            assert str(exc).startswith("--frontends: must be an integer >= 1"), exc
        else:
            raise AssertionError(f"frontends={bad!r} was accepted")
    try:
        StackConfig(frontends=2, clock="virtual").validate()
    except ValueError as exc:
        assert "--frontends" in str(exc)
    else:
        raise AssertionError("--frontends 2 with the virtual clock was accepted")


def test_prefix_routing_through_two_frontends_keeps_each_prefix_on_one_instance(
    start_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    """The prompt's prefix ids travel in the frontend's ask: the router's prefix router
    places requests sharing a prefix together, whichever frontend took them."""
    stack = start_stack(
        policy="sarathi", instances=3, frontends=2, prefix_routing=True, decision_dir=tmp_path
    )
    for k in range(12):  # 3 prefixes, 4 requests each, each on a connection of its own
        ch, stub = own_connection(stack.gateway)
        req = gateway_pb2.GenerateRequest(
            prompt_token_ids=[70 + k // 4] * 200 + [k], max_tokens=4, request_id=f"p-{k}"
        )
        assert len(list(stub.Generate(req, timeout=60))) == 4
        ch.close()
    rows = [json.loads(line) for line in (tmp_path / "router.jsonl").read_text().splitlines()]
    where = {r["request"]: r["instance"] for r in rows if r["kind"] == "dispatch"}
    groups = [{where[f"p-{k}"] for k in range(g * 4, g * 4 + 4)} for g in range(3)]
    assert all(len(g) == 1 for g in groups), groups
    assert len(set.union(*groups)) == 3, groups


def test_a_frontend_refuses_the_gateway_flags_it_has_no_use_for_naming_each(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A frontend reads no registry, registers nothing and holds no Controller: each such
    gateway flag is refused by name (exit 2) instead of accepted and ignored; the command
    ``up --frontends 2`` gives each frontend parses."""
    from sloserve.services.frontend.server import NOT_HERE, build_parser
    from sloserve.services.stack import StackConfig

    for flag in [*NOT_HERE, "--clock"]:
        value = "virtual" if flag == "--clock" else "x"
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(["--router", "r:1", flag, value])
        assert exc.value.code == 2, flag
        assert flag in capsys.readouterr().err, flag
    stack = Stack(StackConfig(frontends=2))
    stack.plan()
    frontends = [s.argv for s in stack.services.values()
                 if "sloserve.services.frontend" in s.argv]
    assert len(frontends) == 2
    for argv in frontends:
        args = build_parser().parse_args(argv[argv.index("sloserve.services.frontend") + 1:])
        assert args.router and args.redis_url is None
    done = subprocess.run([sys.executable, "-m", "sloserve.services.frontend", "--router",
                           "127.0.0.1:1", "--prefix", "p"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--prefix: a frontend reads no registry" in done.stderr
