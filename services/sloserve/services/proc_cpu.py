"""CPU seconds (utime + stime from ``/proc``) of processes found by pid, not by name.

Several stacks run on one machine at once (other engineers', other tests'), so a
measurement must count the processes of the stack it started and nothing else: a
service's own pid, and with ``tree`` every process below it (issue 33, item 3).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sloserve.services.stack import Stack

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name; None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_s(pid: int) -> float:
    """utime + stime (s) of process ``pid`` (0.0 once it is gone)."""
    st = _stat(pid)
    return 0.0 if st is None else (int(st[11]) + int(st[12])) / _TICK


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (children by ``/proc/<p>/stat``'s ppid)."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        st = _stat(int(name))
        if st is not None:
            children.setdefault(int(st[1]), []).append(int(name))
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_cpu_s(pid: int) -> float:
    """utime + stime (s) of ``pid`` and every live process below it."""
    return sum(cpu_s(p) for p in descendants(pid))


def services_cpu_s(pids: Mapping[str, int], tree: bool = True) -> dict[str, float]:
    """utime + stime (s) per named process (with ``tree``: and its live descendants)."""
    return {name: tree_cpu_s(pid) if tree else cpu_s(pid) for name, pid in pids.items()}


def delta(
    before: Mapping[str, float], after: Mapping[str, float], names: Iterable[str] | None = None
) -> dict[str, float]:
    """``after - before`` per name (of ``names``, default all of ``after``)."""
    return {k: after[k] - before.get(k, 0.0) for k in (after if names is None else names)}


def stack_pids(stack: Stack) -> dict[str, int]:
    """Each running service of ``stack`` (``gateway``, ``scheduler-<id>``, ``executor-<id>``,
    ``perfmodel``, ...) by the pid this stack started it as."""
    return {
        name: s.proc.pid
        for name, s in stack.services.items()
        if s.proc is not None and s.proc.poll() is None
    }


def is_frontend(name: str) -> bool:
    """A service that carries the per-token path to clients (the gateway, or frontends)."""
    return name.startswith(("gateway", "frontend"))
