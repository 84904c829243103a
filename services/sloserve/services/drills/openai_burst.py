"""A burst of streamed OpenAI completions over many connections (issue 33: ``up --frontends
N`` is served by every frontend, the token stream exact). Request ``{prefix}-{k}`` carries
its id in ``x-request-id``, a token-id prompt and ``ignore_eos``, so the sim backend's
stream is known in advance (:func:`expected_text`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import httpx

from sloserve.services.executor.backends import pseudo_token


@dataclass
class Burst:
    texts: dict[str, str] = field(default_factory=dict)  # request id -> streamed text
    finish: dict[str, str | None] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)  # usage.completion_tokens
    errors: dict[str, str] = field(default_factory=dict)


def expected_text(request_id: str, max_tokens: int) -> str:
    """What the sim backend streams for ``request_id`` (byte tokens, ``pseudo_token``)."""
    return bytes(pseudo_token(request_id, i) for i in range(max_tokens)).decode()


async def _one(client: httpx.AsyncClient, rid: str, k: int, max_tokens: int, out: Burst) -> None:
    body = {
        "prompt": [65 + k % 50] * (20 + k % 40),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text: list[str] = []
    try:
        async with client.stream(
            "POST", "/v1/completions", json=body, headers={"x-request-id": rid}
        ) as resp:
            if resp.status_code != 200:
                out.errors[rid] = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                obj = json.loads(line[5:])
                if "error" in obj:
                    out.errors[rid] = str(obj["error"])
                    return
                for c in obj.get("choices") or ():
                    text.append(c.get("text") or "")
                    if c.get("finish_reason"):
                        out.finish[rid] = c["finish_reason"]
                if obj.get("usage"):
                    out.tokens[rid] = obj["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        out.errors[rid] = f"{type(exc).__name__}: {exc}"
        return
    out.texts[rid] = "".join(text)


async def burst(
    base_url: str, n: int, max_tokens: int, connections: int, prefix: str, timeout: float = 300
) -> Burst:
    """``n`` streams at once over up to ``connections`` connections (each a client of its
    own, so the kernel spreads them over the frontends sharing the port)."""
    out = Burst()
    clients = [
        httpx.AsyncClient(
            base_url=base_url, timeout=timeout, limits=httpx.Limits(max_connections=1)
        )
        for _ in range(connections)
    ]
    try:
        await asyncio.gather(
            *(_one(clients[k % connections], f"{prefix}-{k}", k, max_tokens, out) for k in range(n))
        )
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    return out
