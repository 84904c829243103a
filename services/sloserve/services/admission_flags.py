"""Admission flags (``sloserve.admission``): one set for the scheduler service and ``up``."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from sloserve.admission import MAX_QUEUED_REQUESTS, MAX_QUEUED_TOKENS, Admission


def add_flags(p: argparse.ArgumentParser) -> None:
    """The admission flags (``sloserve.admission``), for the scheduler and ``up``."""
    p.add_argument("--max-queued-requests", type=int, default=MAX_QUEUED_REQUESTS,
                   help="admission: refuse a new request when this many wait for their first "
                        "token here (0: no bound)")
    p.add_argument("--max-queued-tokens", type=int, default=MAX_QUEUED_TOKENS,
                   help="admission: refuse a new request whose prompt would take the prefill "
                        "tokens queued here past this (0: no bound)")
    p.add_argument("--shed-late", action=argparse.BooleanOptionalAction, default=True,
                   help="admission: refuse a new request the perf model predicts will miss "
                        "its TTFT SLO (queue ahead + own prefill)")
    p.add_argument("--no-admission", action="store_true",
                   help="queue every request (no bound, no shedding)")


def limits_from_args(args: argparse.Namespace) -> Admission | None:
    """The admission limits the flags ask for (``None``: ``--no-admission``)."""
    if args.no_admission:
        return None
    try:
        return Admission(args.max_queued_requests, args.max_queued_tokens, args.shed_late)
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
