"""Following the instance registry in Redis (issue 34, item 2), one code path for whoever
holds the ``Controller``: the one gateway (``--frontends 1``) or the router of several
frontends (issue 33). A ``Joined`` member is asked for its Status (in a task of its own,
so one that does not answer holds up no other event) and handed to ``join``; a ``Left``
one to ``leave``, which carries out ``Controller.on_instance_left``."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import grpc

from sloserve.services import rpc
from sloserve.services.proto import scheduler_grpc, scheduler_pb2
from sloserve.services.registry import Left, Member, Watch


class Members(Protocol):
    """What follows the registry: a member table and the two transitions."""

    log: Any

    def is_member(self, instance_id: str) -> bool: ...
    def join(self, iid: str, address: str, st: scheduler_pb2.SchedulerStatus) -> None: ...
    def leave(self, iid: str, reason: str) -> None: ...


async def scheduler_status(target: str, timeout: float) -> scheduler_pb2.SchedulerStatus:
    """``target``'s Status, retried until it answers or ``timeout`` s pass."""
    stub = scheduler_grpc.SchedulerStub(rpc.channel(target))

    async def status() -> scheduler_pb2.SchedulerStatus:
        st: scheduler_pb2.SchedulerStatus = await stub.Status(
            scheduler_pb2.StatusRequest(), timeout=2.0)
        return st

    return await rpc.retry_until_up(status, timeout)


async def first_members(watch: Watch, static: int, wanted: int,
                        timeout: float) -> dict[str, str]:
    """The schedulers registered once ``wanted`` instances (with the ``static`` ones) are
    known; none within ``timeout`` s raises naming ``--min-instances``."""
    deadline = time.monotonic() + timeout
    while True:
        await watch.poll()
        found = {i: m.address for i, m in watch.known.items()}
        if static + len(found) >= wanted:
            return found
        if time.monotonic() > deadline:
            raise ValueError(f"--min-instances: {static + len(found)} of {wanted} schedulers "
                             f"registered in Redis ({watch.registry.set_key}) after "
                             f"{timeout:g} s (--connect-timeout)")
        await asyncio.sleep(watch.poll_s)


async def follow(members: Members, watch: Watch, timeout: float) -> None:
    """Carry out the registry's joins and leaves for ever; a leave of an instance still
    joining cancels its join."""
    joining: dict[str, asyncio.Task[None]] = {}
    async for ev in watch.events():
        iid = ev.member.id
        if isinstance(ev, Left):
            pending = joining.pop(iid, None)
            if pending is not None:
                pending.cancel()
            members.leave(iid, ev.reason)
        else:
            for done in [i for i, t in joining.items() if t.done()]:
                del joining[done]
            joining[iid] = asyncio.create_task(_join(members, watch, ev.member, timeout))


async def _join(members: Members, watch: Watch, member: Member, timeout: float) -> None:
    iid = member.id
    try:
        st = await scheduler_status(member.address, timeout)
    except grpc.aio.AioRpcError as exc:  # not reachable: looked at again next poll
        members.log.warning("instance_unreachable", instance=iid, address=member.address,
                            code=exc.code().name)
        watch.known.pop(iid, None)
        return
    if not members.is_member(iid):  # else a static --scheduler, or already a member
        members.join(iid, member.address, st)
