"""``sloserve bench --endpoint openai``: replay a workload against an OpenAI-compatible server.

This is how stock ``vllm serve`` runs as the peer (docs/lab/vs-vllm.md). The
workload is the one ``bench`` sends to our gateway (same trace, seed, Poisson
arrivals, SLOs, prompt token ids); the result goes through the same
``bench_cmd.result`` (``summarize``'s and vllm bench serve's metrics), so the JSON
keys match.

Each request is a streamed ``POST /v1/completions`` with the prompt as token
ids, ``max_tokens`` = the request's output length, ``ignore_eos`` (exact output
lengths, as ``vllm bench serve --ignore-eos``), ``temperature`` and
``stream_options.include_usage``. Times are the client's clock: arrival is
when the request is sent, and each token's time is when its SSE chunk was
received, so TTFT here also covers HTTP and tokenisation/detokenisation of
the server (against our gateway, TTFT starts at the gateway).

Token counting: we ask for ``return_token_ids`` (vLLM ≥ 0.10 returns the
chunk's ``token_ids``). A chunk that carries k > 1 tokens (the server
coalesced them) puts its last token at the receive time and spreads the others
evenly back to the previous chunk's time; k > 1 in the first chunk puts all of
them at its receive time. A server that returns no ``token_ids`` counts one
token per chunk with text, and when the final ``usage.completion_tokens``
differs, the counted tokens are re-spread evenly over the chunk times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from sloserve.request import Request, RequestStatus


@dataclass(slots=True)
class Stream:
    """What one streamed completion delivered: (receive time, tokens in chunk) pairs."""

    chunks: list[tuple[float, int]] = field(default_factory=list)
    usage_tokens: int | None = None
    finish_reason: str | None = None
    finish_time: float | None = None
    saw_token_ids: bool = False


def token_times(stream: Stream, sent: float) -> list[float]:
    """One time per output token (module docstring: how coalesced chunks are spread)."""
    chunks = [(t, k) for t, k in stream.chunks if k > 0]
    if (not stream.saw_token_ids and stream.usage_tokens is not None
            and stream.usage_tokens != sum(k for _, k in chunks) and chunks):
        return _respread([t for t, _ in chunks], stream.usage_tokens)
    out: list[float] = []
    prev: float | None = None
    for t, k in chunks:
        if prev is None:
            out.extend([t] * k)
        else:
            out.extend(prev + (t - prev) * (i + 1) / k for i in range(k))
        prev = t
    return out


def _respread(times: list[float], n: int) -> list[float]:
    """``n`` token times spread evenly (linear interpolation) over the chunk times."""
    if n <= 0:
        return []
    if len(times) == 1 or n == 1:
        return [times[0]] * (n - 1) + [times[-1]]
    out = []
    for i in range(n):
        x = i * (len(times) - 1) / (n - 1)
        j = min(int(x), len(times) - 2)
        out.append(times[j] + (times[j + 1] - times[j]) * (x - j))
    return out


def parse_chunk(data: dict[str, Any], now: float, stream: Stream) -> None:
    """Fold one SSE ``data:`` object of a streamed completion into ``stream``."""
    if data.get("usage"):
        stream.usage_tokens = data["usage"].get("completion_tokens")
    for choice in data.get("choices") or []:
        ids = choice.get("token_ids")
        if ids is not None:
            stream.saw_token_ids = True
            k = len(ids)
        else:
            k = 1 if choice.get("text") else 0
        stream.chunks.append((now, k))
        if choice.get("finish_reason"):
            stream.finish_reason = choice["finish_reason"]
            stream.finish_time = now


def body(req: Request, model: str, temperature: float) -> dict[str, Any]:
    from sloserve.services.bench_cmd import prompt_ids

    return {
        "model": model, "prompt": prompt_ids(req), "max_tokens": req.output_len,
        "ignore_eos": True, "temperature": temperature, "stream": True,
        "stream_options": {"include_usage": True}, "return_token_ids": True,
    }


async def complete(client: httpx.AsyncClient, payload: dict[str, Any]) -> tuple[float, Stream]:
    """Send one streamed completion; returns (send time, what came back).

    Raises ``RuntimeError`` naming the HTTP status and the server's message."""
    stream = Stream()
    sent = time.time()
    async with client.stream("POST", "/v1/completions", json=payload) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")[:500]
            raise RuntimeError(f"HTTP {resp.status_code}: {text}")
        async for line in resp.aiter_lines():
            now = time.time()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if "error" in obj:
                raise RuntimeError(f"stream error: {obj['error']}")
            parse_chunk(obj, now, stream)
    return sent, stream


async def _one(client: httpx.AsyncClient, req: Request, model: str, temperature: float,
               t0: float, bar: Any) -> None:
    await asyncio.sleep(max(0.0, t0 + req.arrival_time - time.monotonic()))
    req.arrival_time = time.time()  # provisional, replaced by the exact send time
    try:
        sent, stream = await complete(client, body(req, model, temperature))
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"request {req.request_id}: {type(exc).__name__}: {exc}", file=sys.stderr)
    else:
        req.arrival_time = sent
        req.token_times = token_times(stream, sent)
        req.num_generated = len(req.token_times)
        if stream.finish_reason is not None:
            req.status = RequestStatus.FINISHED
            req.finish_time = req.token_times[-1] if req.token_times else stream.finish_time
    if bar is not None:
        bar.update(1)


async def served_model(client: httpx.AsyncClient, name: str | None) -> dict[str, Any]:
    """The ``GET /v1/models`` entry for ``name`` (default: the first one served)."""
    resp = await client.get("/v1/models")
    resp.raise_for_status()
    models: list[dict[str, Any]] = resp.json().get("data") or []
    if not models:
        raise RuntimeError("GET /v1/models: the server lists no model")
    if name is None:
        return models[0]
    for m in models:
        if m.get("id") == name:
            return m
    ids = ", ".join(str(m.get("id")) for m in models)
    raise ValueError(f"model (--model): {name!r} is not served (served: {ids})")


def base_url(target: str) -> str:
    return target if target.startswith(("http://", "https://")) else f"http://{target}"


async def replay(args: argparse.Namespace) -> dict[str, Any]:
    """One rate (``args.qps`` a number, ``bench_cmd.at_rate``) against ``args.target``."""
    from sloserve.services.bench_cmd import progress, result, send_all, workload_rows

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url(args.target), timeout=httpx.Timeout(None),
                                 limits=limits) as client:
        info = await served_model(client, args.model)
        model = str(info["id"])
        reqs, too_long = workload_rows(args, args.workload_model or model, args.gpu)
        await send_all(reqs, lambda r, t0, bar: _one(client, r, model, args.temperature, t0, bar),
                       *progress(args))
    return result(reqs, args, policy=None, instances=None, model=model, offloads=0,
                  endpoint="openai", target=args.target, too_long=too_long)
