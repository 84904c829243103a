"""The OpenAI fields vLLM users rely on, beyond one prompt and one choice (issue 35, item 2).

Parsing (:func:`parse_surface`): ``n``, batched prompts, ``echo``, penalties,
``min_tokens``, ``min_p``, ``logprobs``/``top_logprobs``, ``response_format``, ``tools`` /
``tool_choice``, ``continue_final_message``, ``stream_options.continuous_usage_stats``. A
body field this server does not know is a 400 naming it (:data:`COMPLETION_FIELDS`,
:data:`CHAT_FIELDS`): nothing is silently ignored. A field at its neutral value
(``repetition_penalty`` 1, ``logprobs`` null, ...) changes nothing and is accepted on every
backend; any other value of a field only vLLM's sampler honours is refused on torch and sim
by :func:`sloserve.services.gateway.validate.check_backends`.

Assembly: logprobs in vLLM's shapes (:func:`chat_logprobs`, :func:`completion_logprobs`),
tool calls (:func:`tool_calls_of`) by vLLM's own ``Parser`` for the gateway's
``--tool-call-parser`` (:class:`VllmTools`, as ``vllm serve --tool-call-parser``): it sets
the structured-output constraint ``required`` and a named function run under, and parses
the finished text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sloserve.services.proto import common_pb2, gateway_pb2

COMMON_FIELDS = frozenset(
    (
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "min_p",
        "logprobs",
        "response_format",
        "user",
        "ttft_slo_ms",
        "tbt_slo_ms",
        "jct_slo_ms",
        "priority",
        "logit_bias",
        "return_token_ids",
    )
)
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "echo", "best_of", "suffix"}
CHAT_FIELDS = COMMON_FIELDS | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "continue_final_message",
    "add_generation_prompt",
}
# accepted only at these values (the neutral ones): anything else is a 400 naming the field
NEUTRAL_ONLY: dict[str, tuple[object, ...]] = {
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "parallel_tool_calls": (None, True),
}
MAX_N = 64  # choices per request (vLLM has no bound; this keeps one body's fan-out sane)
MAX_PROMPTS = 256  # prompts in one /v1/completions batch
LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf to this in its answers


class SurfaceError(ValueError):
    """A body field that is wrong or unsupported; the message starts with its name."""


@dataclass(slots=True)
class Surface:
    """What one OpenAI body asks for beyond one GenerateRequest."""

    n: int = 1
    prompts: list[str | list[int]] = field(default_factory=list)  # completions: each prompt
    echo: bool = False
    top_logprobs: int | None = None  # None: no logprobs; else top alternatives per token
    continuous_usage: bool = False
    token_ids: bool = False  # return_token_ids (vLLM >= 0.10): each event lists its token ids
    tool_choice: str = "none"  # none | auto | required | function (named)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_call: Any = None  # VllmTools.start's parser and request (tool_choice not none)


def _neutral(value: object, neutral: float) -> bool:
    return value is None or value == neutral


def check_fields(body: dict[str, Any], chat: bool) -> None:
    """Unknown fields and fields at a value we do not implement: 400 naming them."""
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for name in body:
        if name not in known:
            raise SurfaceError(f"{name}: not supported by sloserve")
    for name, allowed in NEUTRAL_ONLY.items():
        if name in body and body[name] not in allowed:
            raise SurfaceError(f"{name}: not supported by sloserve (only {allowed[-1]!r})")


def _number(body: dict[str, Any], name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SurfaceError(f"{name}: must be a number, got {v!r}")
    return float(v)


def _int(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise SurfaceError(f"{name}: must be an integer, got {v!r}")
    return v


def _bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise SurfaceError(f"{name}: must be true or false, got {v!r}")
    return v


def sampling_extras(body: dict[str, Any], s: common_pb2.Sampling) -> None:
    """Penalties, ``min_p``, ``min_tokens`` into ``s`` (ranges: ``validate``); a neutral
    value is left unset, so it holds on every backend."""
    for name, neutral in (
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0.0),
        ("repetition_penalty", 1.0),
        ("min_p", 0.0),
    ):
        v = _number(body, name)
        if not _neutral(v, neutral):
            setattr(s, name, v)
    if (m := _int(body, "min_tokens")) is not None:
        if m < 0:
            raise SurfaceError(f"min_tokens: must be >= 0, got {m}")
        s.min_tokens = m


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """Top alternatives per token, or None (chat: ``logprobs`` true + ``top_logprobs``;
    completions: ``logprobs`` an integer)."""
    if chat:
        on = _bool(body, "logprobs")
        top = _int(body, "top_logprobs")
        if top is not None and not on:
            raise SurfaceError("top_logprobs: needs logprobs true")
        if not on:
            return None
        top = 0 if top is None else top
    else:
        top = _int(body, "logprobs")
        if top is None:
            return None
    if not 0 <= top <= 20:
        raise SurfaceError(
            f"{'top_logprobs' if chat else 'logprobs'}: must be in [0, 20], got {top}"
        )
    return top


def response_format(body: dict[str, Any], s: common_pb2.Sampling) -> None:
    """``response_format`` json_object / json_schema -> the structured-output fields."""
    rf = body.get("response_format")
    if rf is None:
        return
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        s.structured_outputs = json.dumps({"json_object": True})
        return
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise SurfaceError("response_format: json_schema needs json_schema.schema, an object")
        s.structured_outputs = json.dumps({"json": schema})
        return
    raise SurfaceError(
        f"response_format: type must be text, json_object or json_schema, got {kind!r}"
    )


def _tools(
    body: dict[str, Any],
    surface: Surface,
    req: gateway_pb2.GenerateRequest,
    tools: VllmTools | None,
) -> None:
    """``tools`` and ``tool_choice``: the tools go to the chat template (as vLLM renders
    them, whatever the choice); any choice but ``none`` runs vLLM's tool calling, which
    needs the gateway's ``--tool-call-parser``."""
    listed, choice = body.get("tools"), body.get("tool_choice")
    if listed is None or listed == []:
        if choice not in (None, "none"):
            raise SurfaceError("tool_choice: needs tools")
        return
    if not (
        isinstance(listed, list)
        and all(
            isinstance(t, dict)
            and t.get("type") == "function"
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str)
            for t in listed
        )
    ):
        raise SurfaceError("tools: must be a list of {type: function, function: {name, ...}}")
    surface.tools = listed
    req.tools_json = json.dumps(listed)
    choice = "auto" if choice is None else choice
    if choice == "none":
        return
    named = isinstance(choice, dict)
    if not named and choice not in ("auto", "required"):
        raise SurfaceError(
            f"tool_choice: must be none, auto, required or a named function, got {choice!r}"
        )
    if tools is None:
        raise SurfaceError(
            f"tool_choice: {'a named function' if named else repr(choice)} "
            "needs the gateway started with --tool-call-parser (as vllm serve)"
        )
    surface.tool_choice = "function" if named else str(choice)
    try:
        surface.tool_call, structured = tools.start(body)
    except ValueError as exc:  # pydantic's ValidationError is one: vLLM's own checks
        raise SurfaceError(f"tools: {str(exc).splitlines()[0]}") from None
    if structured:
        req.sampling.structured_outputs = json.dumps(structured)


class VllmTools:
    """vLLM's tool calling (``vllm serve --enable-auto-tool-choice --tool-call-parser
    NAME``): its ``Parser`` adjusts each request (the structured-output constraint
    ``required`` and a named function run under) and parses the finished text into tool
    calls. Imports vLLM, so only a gateway started with ``--tool-call-parser`` pays."""

    def __init__(self, name: str, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast
        from vllm.parser.parser_manager import ParserManager

        self.tokenizer: Any = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=Tokenizer.from_str(tokenizer_json)
        )
        get: Any = ParserManager.get_parser
        parser = get(tool_parser_name=name, enable_auto_tools=True, tokenizer=self.tokenizer)
        if parser is None:
            raise ValueError(f"--tool-call-parser: vLLM has no parser {name!r}")
        self.parser_cls = parser

    def start(self, body: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
        """(the parser and vLLM's request, to parse the answer with; the structured-output
        constraint vLLM runs this request under, as StructuredOutputsParams fields)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        request: Any = ChatCompletionRequest.model_validate(body)
        parser = self.parser_cls(self.tokenizer, request.tools)
        request = parser.adjust_request(request)
        so = request.structured_outputs
        structured = None
        if so is not None:
            kinds = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
            structured = {k: v for k in kinds if (v := getattr(so, k, None)) not in (None, False)}
        return (parser, request), structured or None

    @staticmethod
    def parse(call: Any, text: str) -> tuple[str | None, list[tuple[str, str]]]:
        """(content, [(function name, arguments JSON)]) of a finished answer."""
        parser, request = call
        _, content, calls = parser.parse(text, request, enable_auto_tools=True)
        return content, [(c.name, c.arguments) for c in calls or ()]


def parse_surface(
    body: dict[str, Any],
    chat: bool,
    req: gateway_pb2.GenerateRequest,
    tools: VllmTools | None = None,
) -> Surface:
    """Everything of the body beyond the base request, into ``req`` (sampling, chat
    rendering) and the returned :class:`Surface` (fan-out, answer shape)."""
    check_fields(body, chat)
    surface = Surface()
    n = _int(body, "n")
    if n is not None and not 1 <= n <= MAX_N:
        raise SurfaceError(f"n: must be in [1, {MAX_N}], got {n}")
    surface.n = n or 1
    sampling_extras(body, req.sampling)
    surface.top_logprobs = _logprobs(body, chat)
    if surface.top_logprobs is not None:
        req.sampling.logprobs = surface.top_logprobs
    response_format(body, req.sampling)
    surface.token_ids = _bool(body, "return_token_ids")
    opts = body.get("stream_options")
    if isinstance(opts, dict):
        surface.continuous_usage = _bool(opts, "continuous_usage_stats")
    if chat:
        if body.get("response_format") not in (None, {"type": "text"}) and (
            body.get("tools") and body.get("tool_choice") not in (None, "none")
        ):
            raise SurfaceError("response_format: not with tool_choice other than none")
        _tools(body, surface, req, tools)
        req.continue_final_message = _bool(body, "continue_final_message")
        if "add_generation_prompt" in body and body["add_generation_prompt"] is not None:
            req.add_generation_prompt = _bool(body, "add_generation_prompt", True)
    else:
        surface.echo = _bool(body, "echo")
        if surface.echo and surface.top_logprobs is not None:
            raise SurfaceError(
                "echo: not with logprobs (the prompt's logprobs are not computed here)"
            )
    return surface


def prompts_of(prompt: object) -> list[str | list[int]] | None:
    """A /v1/completions ``prompt`` as a list of prompts (a string, token ids, or a list of
    either), or None when it is not one of those shapes."""

    def ids(p: object) -> bool:  # ints the wire's int32 token ids hold
        return (
            isinstance(p, list)
            and bool(p)
            and all(
                isinstance(t, int) and not isinstance(t, bool) and -(1 << 31) <= t < (1 << 31)
                for t in p
            )
        )

    if isinstance(prompt, str) or ids(prompt):
        return [prompt]  # type: ignore[list-item]
    if (
        isinstance(prompt, list)
        and prompt
        and len(prompt) <= MAX_PROMPTS
        and all(isinstance(p, str) or ids(p) for p in prompt)
    ):
        return list(prompt)
    return None


# --- answers ------------------------------------------------------------------------
def _top(lp: common_pb2.TokenLogprobs, token_id: int) -> list[tuple[int, float]]:
    """vLLM's per-token dict in order: the sampled token, then the top alternatives (a
    repeat of the sampled one keeps its first place)."""
    out = {token_id: lp.logprob}
    for t, v in zip(lp.top_token_ids, lp.top_logprobs):
        out.setdefault(t, v)
    return list(out.items())


def _floor(v: float) -> float:
    return max(v, LOGPROB_FLOOR)


def chat_logprobs(
    items: Sequence[tuple[int, common_pb2.TokenLogprobs]], top: int, text_of: Callable[[int], str]
) -> dict[str, Any]:
    """``choices[].logprobs`` of a chat answer (vLLM's ``_create_chat_logprobs``)."""
    content = []
    for tid, lp in items:
        tok = text_of(tid)
        alts = (
            [
                {
                    "token": (t := text_of(i)),
                    "logprob": _floor(v),
                    "bytes": list(t.encode("utf-8", errors="replace")),
                }
                for i, v in _top(lp, tid)[:top]
            ]
            if top
            else []
        )
        content.append(
            {
                "token": tok,
                "logprob": _floor(lp.logprob),
                "bytes": list(tok.encode("utf-8", errors="replace")),
                "top_logprobs": alts,
            }
        )
    return {"content": content}


def completion_logprobs(
    items: Sequence[tuple[int, common_pb2.TokenLogprobs]],
    top: int,
    text_of: Callable[[int], str],
    offset: int = 0,
) -> dict[str, Any]:
    """``choices[].logprobs`` of a completion (vLLM's ``_create_completion_logprobs``:
    the sampled token and ``top`` alternatives per token, offsets into the text)."""
    tokens: list[str] = []
    offsets: list[int] = []
    values: list[float] = []
    tops: list[dict[str, float]] = []
    for tid, lp in items:
        tok = text_of(tid)
        offsets.append(offset if not offsets else offsets[-1] + len(tokens[-1]))
        tokens.append(tok)
        values.append(_floor(lp.logprob))
        tops.append({text_of(i): _floor(v) for i, v in _top(lp, tid)[: top + 1]})
    return {
        "text_offset": offsets,
        "token_logprobs": values,
        "tokens": tokens,
        "top_logprobs": tops,
    }


def tool_calls_of(
    surface: Surface,
    text: str,
    tools: VllmTools | None,
) -> tuple[str | None, list[dict[str, Any]] | None, str | None]:
    """(content, tool_calls, finish_reason override) of a finished chat answer: vLLM's
    parser's calls, ``tool_calls`` as the reason when ``auto`` or ``required`` called one
    (vLLM's rule; a named function keeps ``stop``); no ``tool_calls`` without tools."""
    if not surface.tools:
        return text, None, None
    if surface.tool_call is None or tools is None:
        return text, [], None
    content, calls = tools.parse(surface.tool_call, text)
    out = [
        {
            "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
            "type": "function",
            "function": {"name": name, "arguments": args},
        }
        for name, args in calls
    ]
    reason = "tool_calls" if out and surface.tool_choice in ("auto", "required") else None
    return (content if content is not None else ("" if out else None)), out, reason
