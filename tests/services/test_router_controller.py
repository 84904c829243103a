"""The router (issue 33, item 2) is the simulator's Controller behind a stream: driven in
process with two frontends' asks and a scheduler's reports, its actions are exactly the
core Controller's for the same events (the class ``sim.simulator`` drives), each sent to
the frontend that asked; a frontend that goes away gives back its HP ticket."""

from __future__ import annotations

import asyncio

from sloserve.controller import Controller, Dispatch
from sloserve.request import Request
from sloserve.services.proto import router_pb2, scheduler_pb2
from sloserve.services.router.server import RouterService
from sloserve.sim import simulator

ROLES = [("lp0", "lp"), ("lp1", "lp"), ("hp2", "hp")]


def _ask(rid: str) -> router_pb2.RouteAsk:
    return router_pb2.RouteAsk(request_id=rid, arrival_time=1.0, prompt_len=10, max_tokens=4)


def _drain(q: asyncio.Queue[router_pb2.RouterOutput | None]) -> list[tuple[str, str, str]]:
    out = []
    while not q.empty():
        msg = q.get_nowait()
        assert msg is not None
        out += [(a.request_id, a.instance_id, a.cause) for a in msg.actions]
    return out


def _first_token(rid: str, instance: str, waiting: int) -> scheduler_pb2.SchedulerOutput:
    out = scheduler_pb2.SchedulerOutput(time=2.0)
    out.tokens.add(request_id=rid, index=0, token_id=1, time=2.0)
    out.state.instance_id, out.state.num_waiting_prefills = instance, waiting
    return out


def test_router_answers_each_frontend_with_the_simulators_controller_decisions() -> None:
    assert simulator.Controller is Controller  # the class the simulator drives

    async def run() -> None:
        svc = RouterService(Controller(ROLES), {i: "127.0.0.1:1" for i, _ in ROLES})
        qa: asyncio.Queue[router_pb2.RouterOutput | None] = asyncio.Queue()
        qb: asyncio.Queue[router_pb2.RouterOutput | None] = asyncio.Queue()
        svc.frontends.update(a=qa, b=qb)
        ref = Controller(ROLES)  # the same events, straight into the core

        def both(fid: str, rid: str) -> Dispatch:
            svc.route(fid, _ask(rid))
            d = ref.admit(Request(rid, 1.0, 10, 4), 1.0)
            assert isinstance(d, Dispatch)
            return d

        want_a = [both("a", "r1")]  # the HP's ticket
        want_b = [both("b", "r2"), both("b", "r3")]  # one ticket at a time: the LPs
        out = _first_token("r1", "hp2", 0)
        svc.on_output("hp2", out)
        ref.on_tokens(out.tokens)
        ref.on_instance_state("hp2", 0, 2.0)
        want_b.append(both("b", "r4"))  # r1 has its first token: the ticket is free again
        assert [d.cause for d in want_a + want_b] == ["ticket", "route", "route", "ticket"]
        assert _drain(qa) == [(d.request_id, d.instance_id, d.cause) for d in want_a]
        assert _drain(qb) == [(d.request_id, d.instance_id, d.cause) for d in want_b]

        svc.on_output("hp2", _first_token("r0", "hp2", 0))  # an idle HP again
        svc._frontend_gone("b")  # r4 never had its first token: its ticket comes back
        svc.route("a", _ask("r5"))
        assert _drain(qa) == [("r5", "hp2", "ticket")]

    asyncio.run(run())


def test_router_tells_frontends_of_joins_before_dispatches_and_of_leaves_after_reruns() -> None:
    """Membership on the Control stream (``InstanceEvent``): a frontend hears of a joined
    instance before the first Dispatch to it, and of a departed one after the re-runs of
    its requests; a restored request a frontend adopted (``placed``) is re-run to it."""

    async def run() -> None:
        roles = [("lp0", "lp"), ("lp1", "lp")]
        svc = RouterService(Controller(roles), {i: "127.0.0.1:1" for i, _ in roles})
        qa: asyncio.Queue[router_pb2.RouterOutput | None] = asyncio.Queue()
        svc.frontends["a"] = qa
        st = scheduler_pb2.SchedulerStatus(instance_id="lp2", role="lp")
        svc.join("lp2", "127.0.0.1:2", st)
        for rid in ("r1", "r2", "r3"):
            svc.route("a", _ask(rid))
        svc.placed("a", router_pb2.Placement(request_id="old", instance_id="lp2", started=True))
        svc.leave("lp2", "deregistered")
        msgs = []
        while not qa.empty():
            m = qa.get_nowait()
            assert m is not None
            msgs += [("join", e.instance_id) for e in m.instances if not e.left]
            msgs += [("dispatch", a.request_id, a.instance_id, a.cause) for a in m.actions]
            msgs += [("left", e.instance_id) for e in m.instances if e.left]
        on_lp2 = [m for m in msgs if m[0] == "dispatch" and m[2] == "lp2"]
        assert on_lp2 and msgs.index(("join", "lp2")) < msgs.index(on_lp2[0])
        reruns = [m for m in msgs if m[0] == "dispatch" and m[3] == "rerun"]
        assert {m[1] for m in reruns} == {on_lp2[0][1], "old"}  # its own and the adopted
        assert msgs[-1] == ("left", "lp2")  # after the re-runs
        assert "lp2" not in svc.links and "lp2" not in svc.ctl.waiting_prefills
        for t in [t for ts in svc.tasks.values() for t in ts]:
            t.cancel()

    asyncio.run(run())
