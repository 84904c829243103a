"""Executed batches on a Redis stream: executors append, the perf-model service reads.

One entry per batch: ``p`` = prefill chunks as ``chunk:context`` pairs,
``d`` = decode contexts, ``t`` = measured seconds, ``src`` = ``sweep`` for
the startup profiling run (vLLM-style) or ``run`` for served batches.
"""

from __future__ import annotations

from collections.abc import Mapping

from sloserve.batch import BatchSample, BatchShape

MAXLEN = 200_000  # approximate cap of the stream (XADD MAXLEN ~)


def encode(sample: BatchSample, src: str = "run") -> dict[str, str]:
    s = sample.shape
    return {
        "p": ",".join(f"{c}:{x}" for c, x in s.prefills),
        "d": ",".join(map(str, s.decodes)),
        "t": repr(sample.duration),
        "src": src,
    }


def decode(fields: Mapping[bytes, bytes]) -> BatchSample:
    p, d = fields[b"p"].decode(), fields[b"d"].decode()
    prefills = tuple(
        (int(c), int(x)) for c, x in (pair.split(":") for pair in p.split(",") if pair)
    )
    decodes = tuple(int(x) for x in d.split(",") if x)
    return BatchSample(BatchShape(prefills, decodes), float(fields[b"t"]))
