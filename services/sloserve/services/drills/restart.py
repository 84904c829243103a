"""Whole-stack restart drill (issue 34, item 6): ``n`` streams, the whole stack stopped
mid-run (SIGTERM, as ``up`` stops; or SIGKILL, a crash) and started again on the same
Redis and prefix, then every client re-attaches by its request id (``Client.attach``)
from the tokens it has. Each request is counted as resumed (the rest of its stream, every
index once, the sim backend's pseudo-tokens) or ended with a status, and the gateway's
log is searched for its line (``request_resumed_end``, ``request_not_reattached``).
Used by ``tests/services/test_stack_restart.py`` and ``infra/experiments/stack_restart.py``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sloserve.client import Chunk, Client, SloserveError, Unavailable
from sloserve.services.executor.backends import pseudo_token
from sloserve.services.stack import Stack

RESUMED_LINE, ENDED_LINE = "request_resumed_end", "request_not_reattached"


@dataclass
class Outcome:
    """One request across the restart."""

    request_id: str
    before: int  # tokens its client had when the stack went down
    after: int = 0  # tokens it got on re-attaching
    resumed: bool = False  # the rest of its stream, exact (indices once, expected tokens)
    status: str = ""  # not resumed: the status Attach answered (CODE: details)
    logged: bool = False  # the gateway logged how it ended

    def row(self) -> dict[str, object]:
        return asdict(self)


def _stream(
    client: Client, rid: str, k: int, max_tokens: int, got: list[Chunk], started: threading.Barrier
) -> None:
    try:
        for c in client.generate(
            prompt_token_ids=[65 + k % 50] * (30 + 5 * k),
            max_tokens=max_tokens,
            ttft_slo=60.0,
            tbt_slo=60.0,
            request_id=rid,
            timeout=300,
        ):
            got.append(c)
            if len(got) == 1:
                started.wait(timeout=60)
    except (SloserveError, threading.BrokenBarrierError):
        pass  # the stack went away under it: expected


def stop(stack: Stack, sig: int) -> None:
    """Stop every service with ``sig``: SIGTERM in ``Stack.stop``'s order (as ``up``
    stops), anything else (SIGKILL: a crash) to all at once."""
    if sig == signal.SIGTERM:
        stack.stop()
        return
    procs = [s.proc for s in stack.services.values() if s.proc is not None]
    for p in procs:
        p.send_signal(sig)
    for p in procs:
        p.wait(timeout=10)


def attach_all(
    client: Client, outcomes: list[Outcome], max_tokens: int, deadline_s: float = 120.0
) -> None:
    """Every client re-attaches from the tokens it has (retrying while the gateway says
    its instances are still reconnecting), in parallel."""

    def one(o: Outcome) -> None:
        end = time.monotonic() + deadline_s
        while True:
            try:
                got = list(client.attach(o.request_id, o.before, timeout=deadline_s))
                break
            except Unavailable:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)
            except SloserveError as exc:
                o.status = f"{exc.code.name}: {exc.details}"
                return
        o.after = len(got)
        o.resumed = (
            [c.index for c in got] == list(range(o.before, max_tokens))
            and [c.token_id for c in got]
            == [pseudo_token(o.request_id, i) for i in range(o.before, max_tokens)]
            and bool(got)
            and got[-1].finish_reason == "length"
        )
        if not o.resumed:
            o.status = f"INCOMPLETE: indices {[c.index for c in got][:5]}..."

    threads = [threading.Thread(target=one, args=(o,)) for o in outcomes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=deadline_s + 30)


def logged(log: Path, outcomes: list[Outcome]) -> None:
    """Mark each outcome whose end the gateway logged (a line naming the request)."""
    lines = log.read_text().splitlines() if log.exists() else []
    for o in outcomes:
        needle = f'"{o.request_id}"'
        o.logged = any(
            needle in line and (RESUMED_LINE in line or ENDED_LINE in line) for line in lines
        )


def drill(
    stack: Stack,
    n: int,
    max_tokens: int,
    sig: int = signal.SIGTERM,
    prefix: str = "restart",
    attach_after_s: float = 0.0,
    mid_run_s: float = 0.3,
    on_restart: Callable[[Stack], None] | None = None,
    reattach: Callable[[Stack, list[Outcome], int], None] | None = None,
) -> tuple[list[Outcome], float]:
    """Run the drill on a started ``stack`` (with a ``log_dir`` and a fixed prefix);
    returns each request's outcome and the seconds the stack was down. ``on_restart``:
    called between the stop and the start (e.g. to change the gateway's flags);
    ``reattach``: how the clients re-attach (default: :func:`attach_all`, gRPC)."""
    client = Client(stack.gateway)
    started = threading.Barrier(n + 1)
    got: dict[str, list[Chunk]] = {f"{prefix}-{k}": [] for k in range(n)}
    threads = [
        threading.Thread(target=_stream, args=(client, rid, k, max_tokens, chunks, started))
        for k, (rid, chunks) in enumerate(got.items())
    ]
    for t in threads:
        t.start()
    started.wait(timeout=60)  # every stream has its first token
    time.sleep(mid_run_s)
    down_t0 = time.monotonic()
    stop(stack, sig)
    if on_restart is not None:
        on_restart(stack)
    stack.start()
    down = time.monotonic() - down_t0
    for t in threads:
        t.join(timeout=30)
    client.close()
    outcomes = [Outcome(rid, len(chunks)) for rid, chunks in got.items()]
    time.sleep(attach_after_s)
    if reattach is not None:
        reattach(stack, outcomes, max_tokens)
    else:
        client = Client(stack.gateway)
        attach_all(client, outcomes, max_tokens)
        client.close()
    assert stack.cfg.log_dir is not None
    time.sleep(0.5)  # the gateway's last lines
    logged(stack.cfg.log_dir / "gateway.log", outcomes)
    return outcomes, down
