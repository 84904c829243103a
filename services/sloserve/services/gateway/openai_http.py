"""OpenAI-compatible HTTP API on the gateway (vLLM's port 8000), a thin shell over the
same request path as gRPC ``Generate`` (:meth:`GatewayService.open` / ``tokens``):
one process, one event loop, one controller and one stream per scheduler.

``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE in OpenAI's chunk shapes
ending ``data: [DONE]``, ``stream_options.include_usage``; ``usage`` on every
non-streamed answer), ``GET /v1/models``, ``/health``, ``/metrics``. Errors are
OpenAI's JSON ``{"error": {"message", "type", "param", "code"}}``: 400 bad input,
401 missing/wrong API key, 404 unknown model, 429 dropped under overload, 503 no
scheduler connected (both with ``Retry-After``). Sampling as vLLM's OpenAI server takes
it (``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``stop_token_ids``,
``ignore_eos``, ``max_tokens``/``max_completion_tokens``, ``n`` = 1). SLOs and priority:
body fields ``ttft_slo_ms``, ``tbt_slo_ms``, ``jct_slo_ms``, ``priority``, or llm-d's
headers ``x-llm-d-slo-ttft-ms``, ``x-llm-d-slo-tpot-ms`` (the body wins); a request
without them gets the gateway's defaults, scored but never a reason to shed it.

Re-attaching after a whole-stack restart (issue 34, item 6; the gRPC API's ``Attach``):
``GET /v1/completions/{id}`` and ``GET /v1/chat/completions/{id}`` (the id as the request
was made, or its ``cmpl-``/``chatcmpl-`` form) answer the rest of a restored request from
token ``starting_after`` + 1 (OpenAI's Responses API's parameter; none: from the start),
as SSE with ``stream=true``, else the whole object once it ends. 404: no such request,
410: it ended before a client re-attached (the message says how), 503: the gateway is
still reconnecting to its instances (``Retry-After``).

A streamed request waits for its first token before answering, so a request dropped
before it gets a 429 status, not a broken stream; a drop after it ends the stream with
an error event, then ``[DONE]``.

Tokens ready at once leave in one SSE event (and at most every ``--stream-interval``
tokens: vLLM's ``stream_interval``), its ``text`` their texts joined; with
``return_token_ids`` (vLLM >= 0.10) each choice lists the event's ``token_ids``. Each
event's JSON is serialized once, by orjson (issue 33, item 3).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from sloserve.admission import RETRY_AFTER_S
from sloserve.services import auth
from sloserve.services.gateway.openai_surface import (
    MAX_PROMPTS,
    Surface,
    SurfaceError,
    VllmTools,
    chat_logprobs,
    completion_logprobs,
    parse_surface,
    prompts_of,
    tool_calls_of,
)
from sloserve.services.gateway.server import Delta, Flight, GatewayError, GatewayService
from sloserve.services.gateway.validate import InputLimits, InvalidInput, check_slo
from sloserve.services.proto import common_pb2, gateway_pb2
from sloserve.services.tls import ServerTLS

STATUS = {  # gRPC code -> (HTTP status, OpenAI error type)
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.ALREADY_EXISTS: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.CANCELLED: (499, "cancelled"),
    # a request restored after a restart that ended before its client re-attached
    grpc.StatusCode.ABORTED: (410, "invalid_request_error"),
}
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat fills the context
HTTP_FIELDS = {"prompt_token_ids": "prompt", "request_id": "x-request-id",  # gRPC -> HTTP
               "structured_outputs": "response_format"}
INT32 = (-(1 << 31), (1 << 31) - 1)  # the wire's int32 fields (token ids, top_k, priority)
INT64 = (-(1 << 63), (1 << 63) - 1)  # seed, as vLLM's OpenAI server bounds it


class BadRequest(GatewayError):
    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
                 error_code: str | None = None) -> None:
        super().__init__(code, message)
        self.error_code = error_code


def error_response(exc: GatewayError, renames: dict[str, str] | None = None) -> JSONResponse:
    status, kind = STATUS.get(exc.code, (500, "internal_error"))
    # shed (429) or no scheduler yet (503): when to try again (RFC 9110 §10.2.3), so
    # clients (the openai SDK) wait that long instead of retrying at once; a per-key limit
    # says when its bucket holds the request (whole seconds)
    retry = getattr(exc, "retry_after_s", None)
    if retry is None and status in (429, 503):
        retry = RETRY_AFTER_S
    headers = None if retry is None else {"Retry-After": str(max(1, math.ceil(retry)))}
    return JSONResponse(error_body(exc, renames), status_code=status, headers=headers)


def error_body(exc: GatewayError, renames: dict[str, str] | None = None) -> dict[str, Any]:
    _, kind = STATUS.get(exc.code, (500, "server_error"))
    message = http_names(exc.message, renames)
    field, sep, _ = message.partition(":")
    param = field if sep and field.replace("_", "").replace(".", "").replace("[", "").replace(
        "]", "").replace("-", "").isalnum() and " " not in field else None
    code = getattr(exc, "error_code", None) or exc.code.name.lower()
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def http_names(message: str, renames: dict[str, str] | None = None) -> str:
    """A gateway message (it names gRPC fields) naming the field as the HTTP body or header
    has it: ``sampling.top_p`` is ``top_p``, ``prompt_token_ids`` is ``prompt``;
    ``renames``: this body's own (chat's ``max_completion_tokens``)."""
    field, sep, rest = message.partition(":")
    if not sep:
        return message
    if field.startswith("sampling."):
        field = field[len("sampling."):]
    names = {**HTTP_FIELDS, **(renames or {})}
    return f"{names.get(field, field)}{sep}{rest}"


# --- request body -> GenerateRequest ---------------------------------------------------
def _num(body: dict[str, Any], name: str, kind: type, lo: float | None = None,
         hi: float | None = None) -> Any:
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:  # an int of any size, or an integral float (no float() of a huge int)
        ok = ok and (isinstance(value, int) or value.is_integer())
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise BadRequest(f"{name}: must be {'an integer' if kind is int else 'a number'}, "
                         f"got {value!r}")
    if lo is not None and value < lo:
        raise BadRequest(f"{name}: must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise BadRequest(f"{name}: must be <= {hi}, got {value}")
    return kind(value)


def _slo_ms(body: dict[str, Any], headers: Any, name: str, header: str | None,
            inputs: InputLimits) -> float | None:
    """An SLO in seconds from the body field ``name`` (ms), else from ``header`` (ms);
    out of the gateway's range is a 400 naming the field as the client wrote it."""
    ms, field = _num(body, name, float), name
    if ms is None and header is not None and header in headers:
        field = header
        try:
            ms = float(headers[header])
        except ValueError:
            raise BadRequest(f"{header}: must be a number of milliseconds, "
                             f"got {headers[header]!r}") from None
    if ms is None:
        return None
    try:  # the gRPC API's check (validate), in the field's milliseconds
        check_slo(field, ms, inputs, "milliseconds", 1000.0)
    except InvalidInput as exc:
        raise BadRequest(str(exc)) from None
    return float(ms) / 1000.0


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise BadRequest("stop: must be a string or a list of strings")


def _sampling(body: dict[str, Any]) -> common_pb2.Sampling:
    """Types and what the wire holds; the ranges are the gRPC API's (``validate``)."""
    s = common_pb2.Sampling(stop=_stop(body))
    if (t := _num(body, "temperature", float)) is not None:
        s.temperature = t
    if (p := _num(body, "top_p", float)) is not None:
        s.top_p = p
    if (k := _num(body, "top_k", int, *INT32)) is not None:
        s.top_k = k  # vLLM's -1 (or 0) disables; the gateway's spec makes -1 our 0
    if (seed := _num(body, "seed", int, *INT64)) is not None:
        s.seed = seed
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"ignore_eos: must be true or false, got {ignore_eos!r}")
    s.ignore_eos = ignore_eos
    ids = body.get("stop_token_ids") or []
    if not (isinstance(ids, list) and all(_token_id(i) for i in ids)):
        raise BadRequest("stop_token_ids: must be a list of token ids")
    s.stop_token_ids.extend(ids)
    return s


def _token_id(t: object) -> bool:
    """An int the wire's int32 token ids hold (the gateway checks the vocabulary)."""
    return isinstance(t, int) and not isinstance(t, bool) and INT32[0] <= t <= INT32[1]


SCALARS = frozenset((int, float, bool, type(None)))  # JSON values that hold no text
# where a lone surrogate can come from in a body's bytes: a \uD800-\uDFFF escape, or the
# bytes of one (json.loads decodes bytes with surrogatepass); a hit may be a valid pair
SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
WALK_BUDGET = 50_000  # containers and strings looked at to name the field, at most


def lone_surrogate(body: Any, raw: bytes | None = None) -> str | None:
    """Where ``body`` (parsed JSON; ``raw``: its bytes) holds a string with a lone
    surrogate, as a message naming the field (``prompt``, ``messages[0].content``,
    ``stop[1]``): JSON's ``\\ud800`` escape lets one through, and UTF-8 (the wire's
    strings, the tokenizer, the answer) cannot hold it (issue 36, item 1). Costs a regex
    over ``raw`` in C for a body that cannot hold one, one encode in C for a body whose
    escapes all pair up; only a body with one is walked (iteratively, at most
    :data:`WALK_BUDGET` items, else the body is named)."""
    if raw is not None and SURROGATE_HINT.search(raw) is None:
        return None
    try:
        json.dumps(body, ensure_ascii=False).encode()
        return None
    except (UnicodeEncodeError, ValueError, TypeError):
        pass
    todo: list[tuple[str, Any]] = [("", body)]
    budget = WALK_BUDGET
    while todo and budget > 0:
        path, value = todo.pop()
        budget -= 1
        if isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError as exc:
                return (f"{path or 'body'}: not valid Unicode (a lone surrogate "
                        f"U+{ord(value[exc.start]):04X} at character {exc.start})")
        elif isinstance(value, dict):
            for k, item in reversed(value.items()):
                if any(0xD800 <= ord(c) <= 0xDFFF for c in k):
                    return f"{path or 'body'}: a field name is not valid Unicode"
                todo.append((f"{path}.{k}" if path else str(k), item))
        elif isinstance(value, list) and not SCALARS.issuperset(map(type, value)):
            texts = [k for k, t in enumerate(map(type, value)) if t not in SCALARS]
            budget -= len(texts)
            if budget > 0:
                todo.extend((f"{path}[{k}]", value[k]) for k in reversed(texts))
    return "body: not valid Unicode (a lone surrogate)"


def generate_request(body: Any, headers: Any, chat: bool, served: str,
                     inputs: InputLimits | None = None, raw: bytes | None = None,
                     ) -> tuple[gateway_pb2.GenerateRequest, bool]:
    """The gateway request of an OpenAI body with one prompt and one choice, and whether
    max_tokens was left to fill the context (:func:`generate_requests`)."""
    reqs, fill, _ = generate_requests(body, headers, chat, served, inputs, raw)
    return reqs[0], fill


def generate_requests(body: Any, headers: Any, chat: bool, served: str,
                      inputs: InputLimits | None = None, raw: bytes | None = None,
                      tools: VllmTools | None = None,
                      ) -> tuple[list[gateway_pb2.GenerateRequest], bool, Surface]:
    """The gateway requests of an OpenAI body (one per prompt of a batched /v1/completions;
    ``n`` choices each are :func:`children`), whether max_tokens was left to fill the
    context (chat without max_tokens, as vLLM), and what else the body asks for.
    ``inputs``: the gateway's bounds (SLO range; default :class:`InputLimits`'s). Ranges
    are checked where the gRPC API's are (``validate``, in :meth:`GatewayService.open`).
    ``raw``: the body's bytes (spares the surrogate check on a body that cannot hold one)."""
    inputs = inputs or InputLimits()
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    _check_body(body, served, raw)
    req = gateway_pb2.GenerateRequest(sampling=_sampling(body))
    try:
        surface = parse_surface(body, chat, req, tools)
    except SurfaceError as exc:
        raise BadRequest(str(exc)) from None
    if chat:
        _messages(body, req)
    max_tokens = _num(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                      else "max_tokens", int, *INT32)
    fill = max_tokens is None and chat
    req.max_tokens = COMPLETIONS_MAX_TOKENS if max_tokens is None else max_tokens
    for slo, header in (("ttft_slo", "x-llm-d-slo-ttft-ms"), ("tbt_slo", "x-llm-d-slo-tpot-ms"),
                        ("jct_slo", None)):
        value = _slo_ms(body, headers, f"{slo}_ms", header, inputs)
        if value is not None:
            setattr(req, slo, value)
    if (prio := _num(body, "priority", int, *INT32)) is not None:
        req.priority = prio
    rid = headers.get("x-request-id")
    if rid:
        req.request_id = rid
    if chat:
        return [req], fill, surface
    prompts = prompts_of(body.get("prompt"))
    if prompts is None:
        raise BadRequest("prompt: must be a string, a list of token ids, or a list of "
                         f"either (at most {MAX_PROMPTS})")
    surface.prompts = prompts
    reqs = []
    for k, prompt in enumerate(prompts):
        one = gateway_pb2.GenerateRequest()
        one.CopyFrom(req)
        if isinstance(prompt, str):
            one.prompt = prompt
        else:
            one.prompt_token_ids.extend(prompt)
        if len(prompts) > 1 and rid:
            one.request_id = f"{rid}-p{k}"
        reqs.append(one)
    return reqs, fill, surface


def children(reqs: list[gateway_pb2.GenerateRequest], n: int,
             ) -> list[gateway_pb2.GenerateRequest]:
    """The ``n`` choices of each request, in vLLM's order (choice ``k * n + j`` is prompt
    ``k``'s ``j``-th); a seeded request's ``j``-th child samples with seed + j, as vLLM's
    ``ParentRequest`` seeds them."""
    if n == 1:
        return reqs
    out = []
    for r in reqs:
        for j in range(n):
            c = gateway_pb2.GenerateRequest()
            c.CopyFrom(r)
            if r.sampling.HasField("seed"):
                c.sampling.seed = r.sampling.seed + j
            if r.request_id:
                c.request_id = f"{r.request_id}-{j}"
            out.append(c)
    return out


def _check_body(body: dict[str, Any], served: str, raw: bytes | None) -> None:
    """What a body may not hold before it is read field by field (each refused by name):
    a lone surrogate, a non-boolean ``stream``, another model, ``stream_options`` without
    a stream."""
    if (bad := lone_surrogate(body, raw)) is not None:
        raise BadRequest(bad)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"stream: must be true or false, got {stream!r}")
    model = body.get("model")
    if model is not None and model != served:
        raise BadRequest(f"model: the model `{model}` does not exist (serving `{served}`)",
                         grpc.StatusCode.NOT_FOUND, "model_not_found")
    opts = body.get("stream_options")
    if opts is not None and body.get("stream") is not True:  # as OpenAI and vLLM answer
        raise BadRequest("stream_options: only allowed when stream is true")
    if opts is not None and not isinstance(opts, dict):
        raise BadRequest("stream_options: must be an object")


def _messages(body: dict[str, Any], req: gateway_pb2.GenerateRequest) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty list of {role, content} objects")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{k}]: must be an object with a role")
        content = m.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):  # content parts: text only
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise BadRequest(f"messages[{k}].content: only text parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{k}].content: must be a string or text parts")
        req.messages.add(role=m["role"], content=content)


# --- responses ---------------------------------------------------------------------------
def _usage(prompt_tokens: int, n: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": n,
            "total_tokens": prompt_tokens + n}


@dataclass(slots=True)
class Choice:
    """One choice of an answer: its request, and what it has produced so far."""

    index: int
    flight: Flight
    chunks: AsyncGenerator[Delta, None]  # ``GatewayService.tokens``: tokens that left together
    prefix: str = ""  # echo: the prompt's text, before the first token's
    texts: list[str] = field(default_factory=list)
    logprobs: list[tuple[int, common_pb2.TokenLogprobs]] = field(default_factory=list)
    n_tokens: int = 0
    chars: int = 0  # the texts' length (a streamed event's logprobs' text_offset)
    finish: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.flight.spec.prompt_token_ids)

    def take(self, d: Delta) -> list[tuple[int, common_pb2.TokenLogprobs]]:
        """Add ``d``'s tokens; returns those of them with logprobs (id, logprobs)."""
        self.texts += d.texts
        self.chars += sum(map(len, d.texts))
        self.n_tokens += len(d.token_ids)
        self.finish = d.finish_reason or None
        lps = [(tid, lp) for tid, lp in zip(d.token_ids, d.logprobs) if lp is not None]
        self.logprobs += lps
        return lps


class Shapes:
    """OpenAI's object shapes for one answer (completion or chat, one choice or more)."""

    def __init__(self, chat: bool, rid: str, model: str, surface: Surface,
                 text_of: Callable[[int], str], tools: VllmTools | None = None) -> None:
        self.chat, self.model, self.created = chat, model, int(time.time())
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{rid}"
        self.object = "chat.completion" if chat else "text_completion"
        self.surface, self.text_of, self.tools = surface, text_of, tools

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def logprobs(self, items: list[tuple[int, common_pb2.TokenLogprobs]],
                 offset: int = 0) -> dict[str, Any] | None:
        top = self.surface.top_logprobs
        if top is None:
            return None
        if self.chat:
            return chat_logprobs(items, top, self.text_of)
        return completion_logprobs(items, top, self.text_of, offset)

    def choice(self, c: Choice) -> dict[str, Any]:
        """A whole choice of a non-streamed answer."""
        text = c.prefix + "".join(c.texts)
        out: dict[str, Any] = {"index": c.index, "logprobs": self.logprobs(
            c.logprobs, len(c.prefix)), "finish_reason": c.finish}
        if not self.chat:
            out["text"] = text
            return out
        content, calls, reason = tool_calls_of(self.surface, text, self.tools)
        if reason is not None:
            out["finish_reason"] = reason
        out["message"] = {"role": "assistant", "content": content}
        if calls is not None:
            out["message"]["tool_calls"] = calls
        return out

    def full(self, choices: list[Choice]) -> dict[str, Any]:
        usage = _usage(sum(c.prompt_tokens for c in choices[::self.surface.n]),
                       sum(c.n_tokens for c in choices))
        return {**self._base(self.object), "choices": [self.choice(c) for c in choices],
                "usage": usage}

    def chunk(self, text: str | None, finish: str | None, with_usage: bool,
              role: bool = False, index: int = 0,
              logprobs: dict[str, Any] | None = None,
              token_ids: list[int] | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs,
                                  "finish_reason": finish}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = {**self._base(obj), "choices": [choice]}
        if with_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage}


def _sse(obj: dict[str, Any]) -> bytes:
    """One SSE event (compact JSON: orjson; the standard library for what orjson refuses,
    e.g. a lone surrogate in an echoed field)."""
    try:
        return b"data: " + orjson.dumps(obj) + b"\n\n"
    except TypeError:
        return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def capped_body(request: Request, limit: int) -> bytes:
    """The body, refused before it is read (or once it passes ``limit``, when it has no
    Content-Length) if it is over the gateway's message limit: the gRPC API's bound, so a
    huge body is neither buffered nor parsed on the event loop (issue 11, input limits)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"body: {declared} bytes, over the gateway's limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"body: over the gateway's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: Request, limit: int) -> dict[str, Any]:
    """A request's JSON object body (a 400 naming ``body`` otherwise)."""
    try:
        body = json.loads(await capped_body(request, limit))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"body: not valid JSON ({type(exc).__name__})") from None
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    if (bad := lone_surrogate(body)) is not None:
        raise BadRequest(bad)
    return body


def tokenize_body(svc: GatewayService, body: dict[str, Any]) -> list[int]:
    """The token ids of a /tokenize body (``prompt``, or ``messages`` as chat renders them;
    ``add_special_tokens``: the tokenizer's own, e.g. a BOS, as vLLM's default adds)."""
    model = body.get("model")
    if model is not None and model != svc.model:
        raise BadRequest(f"model: the model `{model}` does not exist (serving `{svc.model}`)",
                         grpc.StatusCode.NOT_FOUND, "model_not_found")
    special = body.get("add_special_tokens", "prompt" in body)
    if not isinstance(special, bool):
        raise BadRequest(f"add_special_tokens: must be true or false, got {special!r}")
    if "messages" in body:
        req = gateway_pb2.GenerateRequest()
        try:
            parse_surface({k: v for k, v in body.items() if k in (
                "messages", "tools", "continue_final_message", "add_generation_prompt")},
                True, req)
            _messages(body, req)
            text = svc.render_chat(req)
        except (SurfaceError, InvalidInput) as exc:
            raise BadRequest(str(exc)) from None
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        raise BadRequest("prompt: must be a string (or give messages)")
    if len(text.encode()) > svc.limits.inputs.max_prompt_bytes:
        raise BadRequest(f"prompt: over {svc.limits.inputs.max_prompt_bytes} bytes")
    return svc.tokenizer.encode(text, special)


def sloserve_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("sloserve")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


# --- the app ----------------------------------------------------------------------------
class RequireKey:
    """``/v1/`` answers only a valid API key. Plain ASGI: Starlette's ``@app.middleware``
    (``BaseHTTPMiddleware``) passes every streamed event through a task and a memory
    stream, a cost per SSE event (issue 33, item 3)."""

    def __init__(self, app: ASGIApp, authorized: Callable[[Request], bool]) -> None:
        self.app, self.authorized = app, authorized

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"].startswith("/v1/")
                and not self.authorized(Request(scope))):
            answer = error_response(BadRequest(
                "authorization: a valid API key is required (Authorization: Bearer <key>)",
                grpc.StatusCode.UNAUTHENTICATED, "invalid_api_key"))
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_app(svc: GatewayService, api_keys: frozenset[str] = frozenset()) -> FastAPI:
    app = FastAPI(title="sloserve", docs_url=None, redoc_url=None, openapi_url=None)

    def authorized(request: Request) -> bool:
        if not api_keys:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and auth.valid_key(token.strip(), api_keys)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Starlette's own errors (no such route, wrong method) in OpenAI's shape."""
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(
            exc.status_code, "invalid_request_error")
        message = (f"{request.method} {request.url.path}: "
                   f"{'no such endpoint' if exc.status_code == 404 else exc.detail}")
        return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                       "code": str(exc.status_code)}},
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> Response:
        """A bug answers OpenAI's 500 JSON (the traceback goes to the gateway's log)."""
        svc.log.error("http_error", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return JSONResponse({"error": {"message": f"internal error: {type(exc).__name__}",
                                       "type": "server_error", "param": None,
                                       "code": "internal_error"}}, status_code=500)

    if api_keys:
        app.add_middleware(RequireKey, authorized=authorized)

    @app.get("/health")
    async def health() -> Response:
        if any(link.connected for link in svc.links.values()):
            return Response(status_code=200)
        return error_response(BadRequest("no scheduler connected",
                                         grpc.StatusCode.UNAVAILABLE))

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": svc.model, "object": "model", "created": int(time.time()),
            "owned_by": "sloserve", "root": svc.model, "parent": None,
            "max_model_len": svc.limits.max_tokens_total}]}

    @app.get("/version")
    async def version() -> dict[str, str]:
        """vLLM's ``/version``: this server's version (sloserve's)."""
        return {"version": sloserve_version()}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        """vLLM's ``/tokenize``: a ``prompt`` or chat ``messages`` (rendered as
        /v1/chat/completions renders them) -> its token ids."""
        try:
            body = await json_body(request, svc.limits.inputs.max_message_bytes)
            ids = tokenize_body(svc, body)
        except GatewayError as exc:
            return error_response(exc)
        return JSONResponse({"count": len(ids), "max_model_len": svc.limits.max_tokens_total,
                             "tokens": ids, "token_strs": None})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        """vLLM's ``/detokenize``: ``tokens`` -> their text."""
        try:
            body = await json_body(request, svc.limits.inputs.max_message_bytes)
            ids = body.get("tokens")
            if not (isinstance(ids, list) and all(_token_id(t) for t in ids)):
                raise BadRequest("tokens: must be a list of token ids")
            bad = [t for t in ids if not 0 <= t < svc.limits.vocab_size]
            if bad:
                raise BadRequest(f"tokens: {bad[:3]} outside the vocabulary "
                                 f"[0, {svc.limits.vocab_size})")
        except GatewayError as exc:
            return error_response(exc)
        return JSONResponse({"prompt": svc.tokenizer.decode(ids)})

    async def serve(request: Request, chat: bool) -> Response:
        try:
            raw = await capped_body(request, svc.limits.inputs.max_message_bytes)
            body = json.loads(raw)
        except BadRequest as exc:
            return error_response(exc)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(BadRequest(f"body: not valid JSON ({exc})"))
        except RecursionError:
            return error_response(BadRequest("body: nested too deeply"))
        renames = ({"max_tokens": "max_completion_tokens"}
                   if chat and isinstance(body, dict) and "max_completion_tokens" in body else {})
        try:
            reqs, fill, surface = generate_requests(body, request.headers, chat, svc.model,
                                                    svc.limits.inputs, raw, svc.tools)
            stream = body.get("stream") is True
            if stream and surface.tool_choice != "none":
                raise BadRequest("stream: tool calls (tool_choice auto, required or a named "
                                 "function) are returned whole here; send stream false")
            if not any(link.connected for link in svc.links.values()):
                raise BadRequest("no scheduler connected; retry later",
                                 grpc.StatusCode.UNAVAILABLE)
            _, _, key = request.headers.get("authorization", "").partition(" ")
            owner = auth.key_id(key.strip()) if api_keys else ""
            flights = await open_all(svc, children(reqs, surface.n), fill, owner)
        except GatewayError as exc:
            return error_response(exc, renames)
        opts = body.get("stream_options") or {}
        usage_too = stream and isinstance(opts, dict) and opts.get("include_usage") is True
        shapes = Shapes(chat, flights[0].client_id, svc.model, surface, svc.tokenizer.token_text,
                        svc.tools)
        headers = {"x-request-id": flights[0].client_id}
        # from here on, closing a choice's ``chunks`` releases its request
        choices = [Choice(k, f, svc.tokens(f), echo_text(svc, surface, k)) for k, f in
                   enumerate(flights)]

        async def answer() -> Response:
            try:
                firsts = await first_chunks(choices)
            except GatewayError as exc:
                return error_response(exc)
            if not stream:
                try:
                    await asyncio.gather(*(rest(c, first) for c, first in zip(choices, firsts)))
                except GatewayError as exc:
                    await close_all(choices)
                    return error_response(exc)
                return JSONResponse(shapes.full(choices), headers=headers)
            # from its first byte on, Starlette's StreamingResponse ends the stream (and
            # closes every ``chunks``) when the client goes
            return StreamingResponse(
                _events(shapes, choices, firsts, usage_too, surface.continuous_usage,
                        surface.token_ids),
                media_type="text/event-stream", headers=headers)

        # until the answer's first byte (all of it when not streamed), a client that goes
        # aborts the request at once, freeing its KV, as vLLM's server does (issue 36, 2)
        work = asyncio.ensure_future(answer())
        gone = asyncio.ensure_future(client_gone(request))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
                await asyncio.wait((work,))
                await close_all(choices)
                for f in flights:
                    if svc.flights.get(f.spec.request_id) is f:  # cancelled before it started
                        svc.release(f, cancel=True)
        if work.cancelled():
            return Response(status_code=499)  # nobody reads it: nginx's "client closed"
        return work.result()

    async def reattach(request: Request, request_id: str, chat: bool) -> Response:
        """A restored request's rest (the module's docstring; ``GatewayService.attach``)."""
        rid = request_id.removeprefix("chatcmpl-" if chat else "cmpl-")
        q = request.query_params
        try:
            stream = _query_bool(q.get("stream"), "stream")
            after = q.get("starting_after")
            if after is not None and not re.fullmatch(r"-1|\d{1,9}", after):
                raise BadRequest(f"starting_after: must be an integer >= -1, got {after!r}")
            start = 0 if after is None else int(after) + 1
            _, _, key = request.headers.get("authorization", "").partition(" ")
            f = await svc.attach_any(auth.key_id(key.strip()) if api_keys else "", rid, start)
        except GatewayError as exc:  # the id is the path's {request_id}, not the header
            return error_response(exc, {"request_id": "request_id"})
        shapes = Shapes(chat, f.client_id, svc.model, Surface(), svc.tokenizer.token_text)
        c = Choice(0, f, svc.tokens(f, start))
        headers = {"x-request-id": f.client_id}
        try:
            first = await anext(c.chunks)
        except GatewayError as exc:
            await c.chunks.aclose()
            return error_response(exc)
        except StopAsyncIteration:  # the client had every token already
            c.n_tokens = len(f.spec.generated_token_ids)
            return JSONResponse(shapes.full([c]), headers=headers)
        if stream:
            return StreamingResponse(_events(shapes, [c], [first], False, False),
                                     media_type="text/event-stream", headers=headers)
        c.take(first)
        try:
            async with aclosing(c.chunks):
                async for chunk in c.chunks:
                    c.take(chunk)
        except GatewayError as exc:
            return error_response(exc)
        c.n_tokens = len(f.spec.generated_token_ids)  # usage counts the whole answer
        return JSONResponse(shapes.full([c]), headers=headers)

    @app.get("/v1/completions/{request_id}")
    async def completion_rest(request: Request, request_id: str) -> Response:
        return await reattach(request, request_id, chat=False)

    @app.get("/v1/chat/completions/{request_id}")
    async def chat_completion_rest(request: Request, request_id: str) -> Response:
        return await reattach(request, request_id, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, chat=True)

    return app


def _query_bool(value: str | None, name: str) -> bool:
    if value is None or value.lower() in ("false", "0"):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise BadRequest(f"{name}: must be true or false, got {value!r}")


async def client_gone(request: Request) -> None:
    """Returns once the client has closed its connection (ASGI's ``http.disconnect``, which
    uvicorn sends once the body is read and the socket closes); never, for a server that
    cannot tell."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - not knowing is not being gone
        await asyncio.Future()


async def open_all(svc: GatewayService, reqs: list[gateway_pb2.GenerateRequest],
                   fill: bool, owner: str) -> list[Flight]:
    """Admit every request of one answer, or none: a refusal releases those admitted."""
    flights: list[Flight] = []
    now = time.time()
    try:
        for r in reqs:
            flights.append(await svc.open(r, now, fill_context=fill, owner=owner))
    except GatewayError:
        for f in flights:
            svc.release(f, cancel=True)
        raise
    return flights


def echo_text(svc: GatewayService, surface: Surface, k: int) -> str:
    """Choice ``k``'s echoed prompt (``echo``), as text."""
    if not surface.echo:
        return ""
    prompt = surface.prompts[k // surface.n]
    return prompt if isinstance(prompt, str) else svc.tokenizer.decode(prompt)


async def first_chunks(choices: list[Choice]) -> list[Delta]:
    """Each choice's first chunk (a streamed answer gets its status once all exist); a
    drop of any one closes them all and raises its error."""
    got = await asyncio.gather(*(anext(c.chunks) for c in choices), return_exceptions=True)
    for g in got:
        if isinstance(g, BaseException):
            await close_all(choices)
            if isinstance(g, GatewayError):
                raise g
            if isinstance(g, StopAsyncIteration):  # cannot happen: the last chunk finishes
                raise BadRequest("no output", grpc.StatusCode.INTERNAL)
            raise g
    return cast(list[Delta], got)


async def rest(c: Choice, first: Delta) -> None:
    """The whole of choice ``c`` (non-streamed)."""
    c.take(first)
    if first.finish_reason:
        await c.chunks.aclose()
        return
    async with aclosing(c.chunks):
        async for chunk in c.chunks:
            c.take(chunk)


async def close_all(choices: list[Choice]) -> None:
    for c in choices:
        await c.chunks.aclose()


def _event(shapes: Shapes, c: Choice, d: Delta, usage_too: bool, continuous: bool,
           with_ids: bool = False) -> bytes | None:
    """The SSE event of one :class:`Delta` of choice ``c`` (the tokens that left
    together: their texts joined, their logprobs listed; None when it carries nothing)."""
    text = "".join(d.texts)
    finish = d.finish_reason or None
    if c.prefix and c.n_tokens == 0:
        text = c.prefix + text
    offset = len(c.prefix) + c.chars
    items = c.take(d)
    lp = shapes.logprobs(items, offset) if items else None
    if not (text or finish or lp or with_ids):
        return None
    obj = shapes.chunk(text, finish, usage_too, index=c.index, logprobs=lp,
                       token_ids=d.token_ids if with_ids else None)
    if continuous:  # vLLM's stream_options.continuous_usage_stats: usage on every chunk
        obj["usage"] = _usage(c.prompt_tokens, c.n_tokens)
    return _sse(obj)


async def _events(shapes: Shapes, choices: list[Choice],
                  firsts: list[Delta], usage_too: bool, continuous: bool,
                  with_ids: bool = False) -> AsyncIterator[bytes]:
    """The SSE stream of every choice: one event per :class:`Delta` (the tokens that left
    together) as they come, interleaved across choices."""
    deltas = _one(choices[0], firsts[0]) if len(choices) == 1 else _merged(choices, firsts)
    try:
        if shapes.chat:
            for c in choices:
                yield _sse(shapes.chunk("", None, usage_too, role=True, index=c.index))
        async for c, item in deltas:
            if isinstance(item, GatewayError):
                yield _sse(error_body(item))
            elif (event := _event(shapes, c, item, usage_too, continuous,
                                  with_ids)) is not None:
                yield event
        if usage_too:
            yield _sse(shapes.usage_chunk(_usage(
                sum(c.prompt_tokens for c in choices[::shapes.surface.n]),
                sum(c.n_tokens for c in choices))))
        yield b"data: [DONE]\n\n"
    finally:
        await deltas.aclose()
        await close_all(choices)


Item = tuple[Choice, Delta | GatewayError]


async def _one(c: Choice, first: Delta) -> AsyncGenerator[Item, None]:
    """The one choice's deltas as they come (no task or queue between it and the client:
    a hop per SSE event, issue 33, item 3); its drop last."""
    try:
        chunk: Delta | None = first
        while chunk is not None:
            yield c, chunk
            chunk = None if chunk.finish_reason else await anext(c.chunks, None)
    except GatewayError as exc:
        yield c, exc


async def _merged(choices: list[Choice], firsts: list[Delta]) -> AsyncGenerator[Item, None]:
    """Several choices' deltas (``n`` > 1, several prompts) interleaved as they come: a
    task per choice into one queue; each one's drop after its deltas."""
    queue: asyncio.Queue[tuple[Choice, Delta | GatewayError | None]] = asyncio.Queue()

    async def pump(c: Choice, first: Delta) -> None:
        try:
            chunk: Delta | None = first
            while chunk is not None:
                await queue.put((c, chunk))
                chunk = None if chunk.finish_reason else await anext(c.chunks, None)
        except GatewayError as exc:
            await queue.put((c, exc))
        finally:
            await queue.put((c, None))

    tasks = [asyncio.ensure_future(pump(c, f)) for c, f in zip(choices, firsts)]
    try:
        left = len(choices)
        while left:
            c, item = await queue.get()
            if item is None:
                left -= 1
            else:
                yield c, item
    finally:
        for t in tasks:
            t.cancel()


class _Server(uvicorn.Server):
    """uvicorn in the gateway's loop: the gateway's own handlers own SIGINT/SIGTERM."""

    def capture_signals(self) -> Any:
        from contextlib import nullcontext

        return nullcontext()


async def serve_http(app: FastAPI, host: str, port: int, tls: ServerTLS | None = None) -> None:
    """Serve ``app`` until cancelled (raises ``PortInUse`` when the port is taken); HTTPS
    with ``tls`` (issue 34)."""
    from sloserve.services.rpc import check_port_free

    check_port_free(host, port)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=2,
                            ssl_certfile=tls.cert if tls else None,
                            ssl_keyfile=tls.key if tls else None)
    server = _Server(config)
    await server.serve()

