"""Admission flags (``sloserve.admission``): one set for ``simulate``, ``up`` and the scheduler."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace

from sloserve.admission import MAX_QUEUED_REQUESTS, MAX_QUEUED_TOKENS, Admission


def add_flags(p: argparse.ArgumentParser) -> None:
    """The admission flags (``sloserve.admission``), for ``simulate``, ``up`` and the scheduler.

    Admission is off unless asked for (the Deployment's default, as vLLM: queue
    everything): ``--admission`` turns it on at its defaults, a limit flag turns it
    on with that limit, ``--no-admission`` turns it off over a handed Deployment's.
    """
    g = p.add_argument_group("admission", "bounded queues and TTFT shedding at arrival "
                             "(docs/reliability.md; default off, as vLLM)")
    g.add_argument("--admission", action="store_true", default=None,
                   help="refuse arrivals as the live scheduler can (bounded queues, TTFT "
                        "shedding, at the defaults below unless set)")
    g.add_argument("--max-queued-requests", type=int, default=None,
                   help="admission: refuse a new request when this many wait for their first "
                        f"token here (0: no bound; default: {MAX_QUEUED_REQUESTS})")
    g.add_argument("--max-queued-tokens", type=int, default=None,
                   help="admission: refuse a new request whose prompt would take the prefill "
                        f"tokens queued here past this (0: no bound; default: "
                        f"{MAX_QUEUED_TOKENS})")
    g.add_argument("--shed-late", action=argparse.BooleanOptionalAction, default=None,
                   help="admission: refuse a new request the perf model predicts will miss "
                        "its TTFT SLO (queue ahead + own prefill; default: on)")
    g.add_argument("--no-admission", action="store_true",
                   help="queue every request (no bound, no shedding; the default)")


def limits_from_args(args: argparse.Namespace,
                     base: Admission | None = None) -> Admission | None:
    """The admission limits the flags ask for over ``base`` (the Deployment's; ``None``:
    off, unless a flag turns it on)."""
    if args.no_admission:
        return None
    given = {k: getattr(args, k) for k in ("max_queued_requests", "max_queued_tokens",
                                           "shed_late") if getattr(args, k) is not None}
    if not given and not args.admission:
        return base
    try:
        return replace(base or Admission(), **given)
    except ValueError as exc:
        raise ValueError(f"--{str(exc).replace('_', '-')}") from None


def to_argv(limits: Admission | None) -> list[str]:
    """The scheduler flags that give it ``limits`` (the inverse of :func:`limits_from_args`)."""
    if limits is None:
        return ["--no-admission"]
    return ["--max-queued-requests", str(limits.max_queued_requests),
            "--max-queued-tokens", str(limits.max_queued_tokens),
            "--shed-late" if limits.shed_late else "--no-shed-late"]



def to_json(limits: Admission | None) -> str:
    """``limits`` as the scheduler's ``Status.admission`` reports them."""
    return json.dumps(None if limits is None else asdict(limits))


def from_json(text: str) -> Admission | None:
    """The inverse of :func:`to_json`; ``""`` (a scheduler that does not say) is the defaults."""
    if not text:
        return Admission()
    value = json.loads(text)
    return None if value is None else Admission(**value)
