"""One validator for both front ends (issue 36, items 1 and 5), on a live sim stack: the
same bad value sent over gRPC and over the OpenAI HTTP API is refused by both, with the
same message naming the field as each API spells it; a lone surrogate is a 400 naming
its field on a keep-alive connection that serves on, and invalid UTF-8 on gRPC is
INVALID_ARGUMENT naming its field."""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from redis_source import redis_url

from sloserve.services.proto import common_pb2, gateway_grpc, gateway_pb2
from sloserve.services.stack import Stack, StackConfig
from sloserve.services.store import free_port

REDIS_URL = redis_url()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(StackConfig(gateway_port=free_port(), http_port=free_port(), redis_url=REDIS_URL,
                          prefix=f"sloserve-test:{uuid.uuid4().hex[:10]}",
                          log_dir=Path(tmp_path_factory.mktemp("logs")), refit_interval=0.5,
                          time_scale=0.02))
    try:
        yield s.start()
    finally:
        s.stop()
        r = redis.Redis.from_url(REDIS_URL)
        if keys := list(r.scan_iter(f"{s.prefix}:*")):
            r.delete(*keys)


def _grpc_error(stack: Stack, req: gateway_pb2.GenerateRequest | bytes) -> tuple[str, str]:
    """(status name, details) of a Generate that must fail; "OK" if it streamed."""
    with grpc.insecure_channel(stack.gateway) as ch:
        if isinstance(req, bytes):
            call = ch.unary_stream("/sloserve.v1.Gateway/Generate",
                                   request_serializer=lambda b: b,
                                   response_deserializer=gateway_pb2.GenerateChunk.FromString)
            it = call(req, timeout=10)
        else:
            it = gateway_grpc.GatewayStub(ch).Generate(req, timeout=10)
        try:
            for _ in it:
                pass
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or ""
    return "OK", ""


class Http:
    """One keep-alive connection to the HTTP API (http.client reopens a closed one: the
    test compares sockets to see whether the server kept it)."""

    def __init__(self, stack: Stack) -> None:
        host, _, port = stack.http.removeprefix("http://").partition(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def post(self, path: str, body: str | dict[str, Any],
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any], bool]:
        """(status, JSON answer, whether the server kept the connection open)."""
        raw = body if isinstance(body, str) else json.dumps(body)
        self.conn.request("POST", path, raw.encode(),
                          {"content-type": "application/json", **(headers or {})})
        r = self.conn.getresponse()
        data = json.loads(r.read())
        return r.status, data, not r.will_close

    def close(self) -> None:
        self.conn.close()


# (HTTP body fields, gRPC request fields, the field as HTTP names it, as gRPC names it)
CASES: list[tuple[dict[str, Any], dict[str, Any], str, str]] = [
    ({"temperature": 1e9}, {"sampling": common_pb2.Sampling(temperature=1e9)},
     "temperature", "sampling.temperature"),
    ({"temperature": 2.5}, {"sampling": common_pb2.Sampling(temperature=2.5)},
     "temperature", "sampling.temperature"),
    ({"temperature": -1}, {"sampling": common_pb2.Sampling(temperature=-1)},
     "temperature", "sampling.temperature"),
    ({"top_p": 0}, {"sampling": common_pb2.Sampling(top_p=0)}, "top_p", "sampling.top_p"),
    ({"top_p": 1.5}, {"sampling": common_pb2.Sampling(top_p=1.5)}, "top_p", "sampling.top_p"),
    ({"top_k": -2}, {"sampling": common_pb2.Sampling(top_k=-2)}, "top_k", "sampling.top_k"),
    ({"stop_token_ids": [10**6]}, {"sampling": common_pb2.Sampling(stop_token_ids=[10**6])},
     "stop_token_ids", "sampling.stop_token_ids"),
    ({"stop": ["s"] * 17}, {"sampling": common_pb2.Sampling(stop=["s"] * 17)},
     "stop", "sampling.stop"),
    ({"stop": ""}, {"sampling": common_pb2.Sampling(stop=[""])}, "stop", "sampling.stop"),
    ({"max_tokens": 0}, {"max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"max_tokens": -5}, {"max_tokens": -5}, "max_tokens", "max_tokens"),
    ({"max_tokens": 10**7}, {"max_tokens": 10**7}, "max_tokens", "max_tokens"),
    ({"prompt": [10**6]}, {"prompt": "", "prompt_token_ids": [10**6]},
     "prompt", "prompt_token_ids"),
]


def test_a_bad_value_is_refused_by_both_apis_with_the_same_message(stack: Stack) -> None:
    client, seen = Http(stack), []
    for body, fields, http_field, grpc_field in CASES:
        code, details = _grpc_error(stack, gateway_pb2.GenerateRequest(
            **{"prompt": "hi", "max_tokens": 4, **fields}))
        status, answer, kept = client.post("/v1/completions",
                                           {"prompt": "hi", "max_tokens": 4, **body})
        err = answer.get("error", {})
        seen.append((body, code, details, status, err.get("message")))
        assert code == "INVALID_ARGUMENT" and details.startswith(grpc_field + ":"), seen[-1]
        assert status == 400 and err["param"] == http_field and kept, seen[-1]
        assert err["message"] == http_field + ":" + details.partition(":")[2], seen[-1]
    client.close()


def test_slos_out_of_range_are_refused_by_both_apis_against_the_same_bounds(
        stack: Stack) -> None:
    client = Http(stack)
    for ms in (1e-4, 4e6):  # under 1 ms, over an hour
        code, details = _grpc_error(stack, gateway_pb2.GenerateRequest(
            prompt="hi", max_tokens=4, ttft_slo=ms / 1000))
        status, answer, _ = client.post("/v1/completions",
                                        {"prompt": "hi", "max_tokens": 4, "ttft_slo_ms": ms})
        assert (code, status) == ("INVALID_ARGUMENT", 400)
        assert details.startswith("ttft_slo: must be in [0.001, 3600] seconds")
        assert answer["error"]["message"].startswith(
            "ttft_slo_ms: must be in [1, 3.6e+06] milliseconds")
    client.close()


def test_stream_must_be_a_json_boolean(stack: Stack) -> None:
    client = Http(stack)
    for value in ("yes", 1, "true"):
        status, answer, kept = client.post("/v1/completions",
                                           {"prompt": "hi", "max_tokens": 2, "stream": value})
        assert (status, answer["error"]["param"], kept) == (400, "stream", True), answer
    status, answer, _ = client.post("/v1/completions",
                                    {"prompt": "hi", "max_tokens": 2, "stream": False})
    assert status == 200 and answer["usage"]["completion_tokens"] == 2
    client.close()


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", '{"prompt": "he\\ud800llo", "max_tokens": 2}', "prompt"),
    ("/v1/completions", '{"prompt": ["he\\udc00llo"], "max_tokens": 2}', "prompt[0]"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "he\\ud800llo"}], "max_tokens": 2}',
     "messages[0].content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", '
     '"text": "\\ud800"}]}], "max_tokens": 2}', "messages[0].content[0].text"),
    ("/v1/completions", '{"prompt": "hello", "stop": ["x", "\\udfff"], "max_tokens": 2}',
     "stop[1]"),
    ("/v1/completions", '{"prompt": "hello", "stop": "\\ud800", "max_tokens": 2}', "stop"),
    ("/v1/completions", '{"prompt": "hello", "model": "\\ud800", "max_tokens": 2}', "model"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field_and_the_connection_serves_on(
        stack: Stack, path: str, raw: str, param: str) -> None:
    client = Http(stack)
    status, answer, kept = client.post(path, raw)
    sock = client.conn.sock
    assert status == 400, answer
    err = answer["error"]
    assert err["param"] == param and "lone surrogate" in err["message"], err
    assert kept
    ok, answer, _ = client.post("/v1/completions", {"prompt": "he\ud83d\ude00llo",
                                                    "max_tokens": 2})
    assert ok == 200 and answer["usage"]["completion_tokens"] == 2  # a real pair is fine
    assert client.conn.sock is sock  # the same connection
    client.close()


def test_invalid_utf8_over_grpc_is_invalid_argument_naming_the_field(stack: Stack) -> None:
    surrogate = b"\xed\xa0\x80"  # what a lone U+D800 would be, were UTF-8 to allow it
    cases = {
        "prompt": gateway_pb2.GenerateRequest(prompt="heXXXllo", max_tokens=2),
        "sampling.stop": gateway_pb2.GenerateRequest(
            prompt="hi", max_tokens=2, sampling=common_pb2.Sampling(stop=["XXX"])),
        "messages.content": gateway_pb2.GenerateRequest(
            max_tokens=2, messages=[common_pb2.ChatMessage(role="user", content="XXX")]),
    }
    for field, msg in cases.items():
        raw = msg.SerializeToString().replace(b"XXX", surrogate)
        assert _grpc_error(stack, raw) == ("INVALID_ARGUMENT", f"{field}: not valid UTF-8")
    assert _grpc_error(stack, gateway_pb2.GenerateRequest(prompt="hi", max_tokens=2)) \
        == ("OK", "")


def test_chat_max_completion_tokens_is_named_as_the_body_names_it(stack: Stack) -> None:
    client = Http(stack)
    chat = [{"role": "user", "content": "hi"}]
    for body, param in (({"max_completion_tokens": 0}, "max_completion_tokens"),
                        ({"max_tokens": 0}, "max_tokens")):
        status, answer, _ = client.post("/v1/chat/completions", {"messages": chat, **body})
        assert (status, answer["error"]["param"]) == (400, param), answer
        assert answer["error"]["message"].startswith(f"{param}: must be in [1, ")
    client.close()
