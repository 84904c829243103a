"""The OpenAI HTTP layer without a stack: every bad body is OpenAI's 400 JSON naming the
field as the client wrote it (never a 500 from the wire's int32/int64 fields), and
routes, methods and bugs answer OpenAI's error shape too."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient

from sloserve.services.gateway.openai_http import (
    BadRequest,
    build_app,
    error_body,
    generate_request,
)
from sloserve.services.gateway.server import GatewayError
from sloserve.services.gateway.validate import Limits


def _error(body: dict[str, Any], headers: dict[str, str] | None = None,
           chat: bool = False) -> dict[str, Any]:
    with pytest.raises(BadRequest) as info:
        generate_request(body, headers or {}, chat, "m")
    err: dict[str, Any] = error_body(info.value)["error"]
    return err


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "top_k": 2**40}, "top_k"),
    ({"prompt": "x", "priority": 2**40}, "priority"),
    ({"prompt": "x", "priority": -(2**40)}, "priority"),
    ({"prompt": "x", "max_tokens": 2**40}, "max_tokens"),
    ({"prompt": "x", "seed": 2**63}, "seed"),
    ({"prompt": "x", "n": 10**400}, "n"),
    ({"prompt": [2**40]}, "prompt"),
    ({"prompt": "x", "stop_token_ids": [2**40]}, "stop_token_ids"),
])
def test_integers_the_wire_cannot_hold_are_400_naming_the_field(body: dict[str, Any],
                                                               param: str) -> None:
    err = _error(body)
    assert err["param"] == param and err["message"].startswith(param + ":")
    assert err["type"] == "invalid_request_error"


def test_the_widest_values_the_wire_holds_are_accepted() -> None:
    req, _ = generate_request({"prompt": [0], "seed": -(2**63), "priority": 2**31 - 1,
                               "top_k": -1}, {}, False, "m")
    assert req.sampling.seed == -(2**63) and req.priority == 2**31 - 1
    assert req.sampling.top_k == -1  # as a gRPC client sends it; the spec makes it 0 (below)


def test_slos_out_of_range_name_the_body_field_or_header_in_milliseconds() -> None:
    err = _error({"prompt": "x", "ttft_slo_ms": 1e300})
    assert err["param"] == "ttft_slo_ms" and "milliseconds" in err["message"]
    err = _error({"prompt": "x"}, {"x-llm-d-slo-tpot-ms": "0.0001"})
    assert err["param"] == "x-llm-d-slo-tpot-ms" and "milliseconds" in err["message"]
    err = _error({"prompt": "x"}, {"x-llm-d-slo-ttft-ms": "soon"})
    assert err["param"] == "x-llm-d-slo-ttft-ms"
    req, _ = generate_request({"prompt": "x", "tbt_slo_ms": 50},
                              {"x-llm-d-slo-ttft-ms": "250", "x-llm-d-slo-tpot-ms": "900"},
                              False, "m")
    assert (req.ttft_slo, req.tbt_slo) == (0.25, 0.05)  # the body wins over the header


@pytest.mark.parametrize(("message", "param"), [
    ("sampling.top_p: must be in (0, 1], got 0.0", "top_p"),
    ("sampling.stop: at most 16 strings of 1 to 256 characters", "stop"),
    ("sampling.stop_token_ids: [99] outside [0, 50)", "stop_token_ids"),
    ("prompt_token_ids: 9000 tokens, the limit is 8192", "prompt"),
    ("request_id: only letters, digits and . _ : - are allowed", "x-request-id"),
])
def test_gateway_messages_name_the_http_field(message: str, param: str) -> None:
    err = error_body(GatewayError(grpc.StatusCode.INVALID_ARGUMENT, message))["error"]
    assert err["param"] == param and err["message"].startswith(param + ":")


class _Svc:
    """What ``build_app`` reads of a :class:`GatewayService`; ``open`` is a bug."""

    model = "m"
    limits = Limits(max_tokens_total=64, vocab_size=256)
    links = {"0": SimpleNamespace(connected=True)}
    tools = None  # no --tool-call-parser

    def __init__(self) -> None:
        self.logged: list[dict[str, Any]] = []
        self.log = SimpleNamespace(error=lambda event, **kw: self.logged.append(kw))

    async def open(self, *args: Any, **kw: Any) -> Any:
        raise RuntimeError("a bug")


def test_unknown_routes_wrong_methods_and_bugs_answer_openai_error_json() -> None:
    svc = _Svc()
    client = TestClient(build_app(svc), raise_server_exceptions=False)  # type: ignore[arg-type]
    for method, path, status in (("GET", "/v1/nothing", 404), ("GET", "/v1/completions", 405),
                                 ("POST", "/v1/completions", 500)):
        r = client.request(method, path, json={"prompt": "x"})
        assert r.status_code == status, (path, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "server_error" and "RuntimeError" in err["message"]
    assert "a bug" in svc.logged[0]["error"]


def test_top_k_minus_one_is_vllms_off_over_grpc_too() -> None:
    """The SDK and raw gRPC take vLLM's ``top_k=-1`` (off) as HTTP does: the backends get
    0; below -1 is refused naming the field."""
    from sloserve.client.client import sampling
    from sloserve.services.gateway.validate import InvalidInput, check_request, request_spec
    from sloserve.services.proto import gateway_pb2

    limits = Limits(max_tokens_total=64, vocab_size=256)

    def spec(top_k: int) -> int:
        r = gateway_pb2.GenerateRequest(max_tokens=4, sampling=sampling(top_k=top_k))
        check_request(r, limits)  # the gateway's order: checks, then the spec
        return request_spec(r, [1, 2], limits, {}, 0.0).sampling.top_k

    assert (spec(-1), spec(0), spec(5)) == (0, 0, 5)
    with pytest.raises(InvalidInput, match="sampling.top_k: must be >= -1"):
        spec(-2)


def test_drop_reasons_are_labelled_by_their_kind_never_their_numbers() -> None:
    from sloserve.controller import DROP_BY_POLICY
    from sloserve.policies.slack import LATE_REASON
    from sloserve.services.metrics import drop_label

    assert drop_label("shed: predicted TTFT 1.138s on lp0 exceeds the TTFT SLO 1.000s") == "shed"
    assert drop_label("shed: lp0 has 12 requests queued") == "shed"
    assert drop_label(LATE_REASON) == "slack"
    assert drop_label(DROP_BY_POLICY) == "policy"
    assert drop_label("Input prompt (9000 tokens) is too long and exceeds limit of 8192") \
        == "prompt_too_long"
    assert drop_label("something else (3 of them)") == "other"


@pytest.mark.parametrize(("raw", "where"), [
    (b'{"prompt": "he\\ud800llo"}', "prompt"),
    (b'{"prompt": "\xed\xa0\x80"}', "prompt"),  # a surrogate's bytes: json.loads lets it by
    (b'{"messages": [{"role": "user", "content": "a\\udc00"}]}', "messages[0].content"),
    (b'{"stop": ["a", "\\ud800"]}', "stop[1]"),
    (b'{"prompt": [1, 2, "\\ud83d"]}', "prompt[2]"),
    (b'{"a": [[1, 2], [3, {"b": "\\udfff"}]]}', "a[1][1].b"),
    (b'{"\\ud800": 1}', "body"),
    (b'{"prompt": "\\ud83d\\ude00 a pair is a character"}', None),
    (b'{"prompt": "\\\\ud800 an escaped backslash, then text"}', None),
])
def test_a_lone_surrogate_is_found_and_its_field_named(raw: bytes, where: str | None) -> None:
    from sloserve.services.gateway.openai_http import lone_surrogate

    body = json.loads(raw)
    for given in (raw, None):  # with the bytes' quick check, and without it
        found = lone_surrogate(body, given)
        assert (found.partition(":")[0] if found else None) == where, found
