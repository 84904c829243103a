"""Client input checks at the gateway: every error names the field that is wrong.

Bounds come from one place, :class:`InputLimits` (defaults here, gateway flags
override them), and from the model (:class:`Limits`). :func:`check_request`
runs first, on the message as received, in time independent of its size (lengths
before scans, bytes before tokenizing), so an oversized input costs nothing.

One validator for both front ends (issue 36, item 5): the OpenAI HTTP layer only
checks JSON types and what the wire's fields can hold, builds the same
``GenerateRequest`` a gRPC client sends, and every range (temperature, top_p, top_k,
max_tokens, SLOs, sizes) is checked here, with the same limits and messages; the HTTP
layer renames the field as its body has it (``sampling.top_p`` is ``top_p``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import uuid
from dataclasses import dataclass, fields

from sloserve.services.proto import common_pb2, gateway_pb2


class InvalidInput(ValueError):
    """Bad client input; the message starts with the field name."""


REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]+")
MAX_MESSAGE_BYTES = 4 << 20  # the gateway's gRPC receive limit by default (and the SDK's)
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_TEMPERATURE = 2.0  # OpenAI's documented range [0, 2], on gRPC as on HTTP (issue 36)
MAX_LOGPROBS = 20  # OpenAI's top_logprobs bound (vLLM's default max_logprobs is 20)
# Sampling fields only vLLM's sampler honours here (issue 35, item 2): torch and sim refuse
VLLM_ONLY = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
             "min_tokens", "logprobs", "structured_outputs")
# vLLM's StructuredOutputsParams constraints (one per request)
STRUCTURED_KINDS = frozenset(("json", "json_object", "regex", "choice", "grammar",
                              "structural_tag"))


@dataclass(frozen=True, slots=True)
class InputLimits:
    """Bounds on what a client may send (the gateway's flags: ``--max-message-bytes`` ...)."""

    max_message_bytes: int = MAX_MESSAGE_BYTES  # gRPC refuses a bigger request at once
    # (RESOURCE_EXHAUSTED at its length prefix, nothing buffered; the SDK checks it first)
    max_request_id_chars: int = 128  # of [A-Za-z0-9._:-]
    max_prompt_bytes: int = 1 << 20  # UTF-8 bytes of a text prompt
    min_slo_s: float = 1e-3  # ttft_slo, tbt_slo, jct_slo
    max_slo_s: float = 3600.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{f.name}: must be a positive number, got {value}")
        if self.min_slo_s > self.max_slo_s:
            raise ValueError(f"min_slo_s: {self.min_slo_s} exceeds max_slo_s {self.max_slo_s}")

    @staticmethod
    def add_flags(p: argparse.ArgumentParser) -> None:
        d = InputLimits()
        for f in fields(InputLimits):
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(d, f.name)),
                           default=getattr(d, f.name), help="input limit (default %(default)s)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> InputLimits:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens_total: int  # prompt + max_tokens must fit (model context and KV capacity)
    vocab_size: int
    inputs: InputLimits = InputLimits()


def check_request(r: gateway_pb2.GenerateRequest, limits: Limits) -> None:
    """Every check that needs no tokenizing, cheapest first (raises :class:`InvalidInput`)."""
    lim = limits.inputs
    rid = r.request_id
    if len(rid) > lim.max_request_id_chars:
        raise InvalidInput(
            f"request_id: {len(rid)} characters, at most {lim.max_request_id_chars} allowed")
    if rid and REQUEST_ID.fullmatch(rid) is None:
        raise InvalidInput("request_id: only letters, digits and . _ : - are allowed")
    if r.prompt and r.prompt_token_ids:
        raise InvalidInput("prompt: give either prompt or prompt_token_ids, not both")
    if r.messages and (r.prompt or r.prompt_token_ids):
        raise InvalidInput("messages: give either messages or a prompt, not both")
    n_chars = sum(len(m.content) + len(m.role) for m in r.messages)
    if n_chars > lim.max_prompt_bytes or (
            r.messages and sum(len(m.content.encode()) for m in r.messages) > lim.max_prompt_bytes):
        raise InvalidInput(f"messages: over {lim.max_prompt_bytes} bytes")
    stops = r.sampling.stop
    if len(stops) > MAX_STOP_STRINGS or any(not 0 < len(x) <= MAX_STOP_CHARS for x in stops):
        raise InvalidInput(f"sampling.stop: at most {MAX_STOP_STRINGS} strings of 1 to "
                           f"{MAX_STOP_CHARS} characters")
    prompt = r.prompt  # one copy out of the message
    if len(prompt) > lim.max_prompt_bytes:  # characters <= UTF-8 bytes: no encoding needed
        raise InvalidInput(f"prompt: over {lim.max_prompt_bytes} bytes")
    if prompt and len(prompt.encode()) > lim.max_prompt_bytes:
        raise InvalidInput(f"prompt: over {lim.max_prompt_bytes} bytes")
    n_ids = len(r.prompt_token_ids)
    if n_ids > limits.max_tokens_total:
        raise InvalidInput(
            f"prompt_token_ids: {n_ids} tokens, the limit is {limits.max_tokens_total}")
    if not 1 <= r.max_tokens <= limits.max_tokens_total:
        raise InvalidInput(
            f"max_tokens: must be in [1, {limits.max_tokens_total}], got {r.max_tokens}")
    for name in ("ttft_slo", "tbt_slo", "jct_slo"):
        if r.HasField(name):
            check_slo(name, getattr(r, name), lim)
    check_sampling(r.sampling, limits.vocab_size)


def check_slo(name: str, value: float, lim: InputLimits, unit: str = "seconds",
              per_second: float = 1.0) -> None:
    """``value`` (in ``unit``, ``per_second`` of them a second) within the gateway's SLO
    range; the HTTP API's ``*_slo_ms`` fields pass milliseconds."""
    lo, hi = lim.min_slo_s * per_second, lim.max_slo_s * per_second
    if not (math.isfinite(value) and lo <= value <= hi):
        raise InvalidInput(f"{name}: must be in [{lo:g}, {hi:g}] {unit}, got {value:g}")


def check_sampling(s: common_pb2.Sampling, vocab_size: int) -> None:
    """vLLM's SamplingParams ranges, and OpenAI's [0, 2] for temperature."""
    t = s.temperature
    if s.HasField("temperature") and not (math.isfinite(t) and 0 <= t <= MAX_TEMPERATURE):
        raise InvalidInput(
            f"sampling.temperature: must be in [0, {MAX_TEMPERATURE:g}], got {t:g}")
    if s.HasField("top_p") and not 0 < s.top_p <= 1:
        raise InvalidInput(f"sampling.top_p: must be in (0, 1], got {s.top_p}")
    if s.HasField("top_k") and s.top_k < -1:
        raise InvalidInput(f"sampling.top_k: must be >= -1 (-1 or 0 disables), got {s.top_k}")
    bad = [t for t in s.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidInput(f"sampling.stop_token_ids: {bad[:3]} outside [0, {vocab_size})")
    check_vllm_sampling(s)


def check_vllm_sampling(s: common_pb2.Sampling) -> None:
    """The ranges of the fields only the vllm backend honours (vLLM's SamplingParams
    checks, issue 35 item 2)."""
    for name in ("presence_penalty", "frequency_penalty"):
        if s.HasField(name) and not -2 <= getattr(s, name) <= 2:
            raise InvalidInput(f"sampling.{name}: must be in [-2, 2], got {getattr(s, name)}")
    if s.HasField("repetition_penalty") and not 0 < s.repetition_penalty <= 2:
        raise InvalidInput(f"sampling.repetition_penalty: must be in (0, 2], got "
                           f"{s.repetition_penalty}")
    if s.HasField("min_p") and not 0 <= s.min_p <= 1:
        raise InvalidInput(f"sampling.min_p: must be in [0, 1], got {s.min_p}")
    if s.min_tokens < 0:
        raise InvalidInput(f"sampling.min_tokens: must be >= 0, got {s.min_tokens}")
    if s.HasField("logprobs") and not 0 <= s.logprobs <= MAX_LOGPROBS:
        raise InvalidInput(f"sampling.logprobs: must be in [0, {MAX_LOGPROBS}], got "
                           f"{s.logprobs}")
    if s.structured_outputs:
        try:
            so = json.loads(s.structured_outputs)
        except ValueError as exc:
            raise InvalidInput(f"sampling.structured_outputs: not valid JSON ({exc})") from None
        if not (isinstance(so, dict) and len(so) == 1 and set(so) <= STRUCTURED_KINDS):
            raise InvalidInput("sampling.structured_outputs: one of "
                               f"{', '.join(sorted(STRUCTURED_KINDS))}")
        if "json" in so:
            check_json_schema(so["json"])


def check_json_schema(schema: object) -> None:
    """A JSON schema xgrammar (vLLM's structured-output backend) can compile, checked here
    as vLLM's frontend checks it, so the executor never meets one it cannot run."""
    try:
        import xgrammar
    except ImportError:  # no vLLM here: the executor's grammar compile is the check
        return
    try:
        xgrammar.Grammar.from_json_schema(schema if isinstance(schema, str)
                                          else json.dumps(schema))
    except Exception as exc:  # noqa: BLE001 - xgrammar raises several kinds
        raise InvalidInput(f"sampling.structured_outputs: the JSON schema does not compile "
                           f"({str(exc).splitlines()[0][:200]})") from None


def check_backends(s: common_pb2.Sampling, backends: set[str]) -> None:
    """A field only some backends honour is refused (naming the field and the backend
    that has it) when an instance of this stack runs another one: never ignored."""
    other = sorted(backends - {"vllm"})
    if not other:
        return
    for name in VLLM_ONLY:
        if _set(s, name):
            raise InvalidInput(f"sampling.{name}: supported by the vllm backend only "
                               f"(this stack runs {', '.join(other)})")


def _set(s: common_pb2.Sampling, name: str) -> bool:
    if name in ("min_tokens", "structured_outputs"):
        return bool(getattr(s, name))
    return s.HasField(name)  # type: ignore[arg-type]


def request_spec(
    r: gateway_pb2.GenerateRequest, ids: list[int], limits: Limits,
    slo_defaults: dict[str, float | None], now: float,
) -> common_pb2.RequestSpec:
    """The scheduler-facing spec of a client request (``ids``: its prompt tokens), after
    :func:`check_request`."""
    if not ids:
        raise InvalidInput("prompt: must not be empty")
    if len(ids) > limits.max_tokens_total:
        raise InvalidInput(
            f"prompt: {len(ids)} tokens, the limit is {limits.max_tokens_total}")
    bad = [t for t in ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise InvalidInput(
            f"prompt_token_ids: {bad[:3]} outside the vocabulary [0, {limits.vocab_size})")
    if r.max_tokens < 1:
        raise InvalidInput(f"max_tokens: must be >= 1, got {r.max_tokens}")
    if len(ids) + r.max_tokens > limits.max_tokens_total:
        raise InvalidInput(
            f"max_tokens: prompt ({len(ids)} tokens) + max_tokens ({r.max_tokens}) exceeds "
            f"the limit of {limits.max_tokens_total} tokens")
    spec = common_pb2.RequestSpec(
        request_id=r.request_id or uuid.uuid4().hex, prompt_token_ids=ids,
        max_tokens=r.max_tokens, priority=r.priority, arrival_time=now, dispatch_time=now,
        sampling=r.sampling)
    if spec.sampling.top_k == -1:
        spec.sampling.top_k = 0  # vLLM's -1 (off) is our 0: the backends take k >= 0
    for name in ("ttft_slo", "tbt_slo", "jct_slo"):
        value = getattr(r, name) if r.HasField(name) else slo_defaults.get(name)
        if value is not None:
            check_slo(name, value, limits.inputs)
            setattr(spec, name, value)
            if not r.HasField(name):  # the deployment's, not asked for: never shed for it
                spec.default_slos.append(name.removesuffix("_slo"))
    return spec
