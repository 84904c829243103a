"""Concurrent streams for the fault drills: ``n`` requests, each of its own length, started
at once; the call returns when every one has its first token (so a fault that follows hits
them all mid-stream). Used by the executor/scheduler faults, the Redis outage and Sentinel
failover drills and their experiments."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sloserve.client import Chunk, Client


@dataclass
class Streams:
    """What the streams made: ``results[k]`` every chunk of stream ``k`` (request id
    ``{prefix}-{k}``), ``errors`` those that raised; filled while the threads run."""

    threads: list[threading.Thread] = field(default_factory=list)
    results: dict[int, list[Chunk]] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)

    def alive(self) -> int:
        return sum(1 for t in self.threads if t.is_alive())

    def join(self, timeout: float = 300) -> None:
        for t in self.threads:
            t.join(timeout=timeout)


def start_streams(client: Client, n: int, max_tokens: int, prefix: str,
                  timeout: float = 300, first_token_s: float = 60) -> Streams:
    """``n`` streams (stream ``k``: a ``30 + 5k``-token prompt, ``max_tokens`` tokens, SLOs
    that never shed it), returned once each has its first token (or ``first_token_s``)."""
    out = Streams()
    started = threading.Barrier(n + 1)

    def one(k: int) -> None:
        try:
            chunks: list[Chunk] = []
            for c in client.generate(prompt_token_ids=[65 + k % 50] * (30 + 5 * k),
                                     max_tokens=max_tokens, ttft_slo=60.0, tbt_slo=60.0,
                                     request_id=f"{prefix}-{k}", timeout=timeout):
                if not chunks:
                    started.wait(timeout=first_token_s)
                chunks.append(c)
            out.results[k] = chunks
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            out.errors.append(exc)

    out.threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in out.threads:
        t.start()
    started.wait(timeout=first_token_s)
    return out
