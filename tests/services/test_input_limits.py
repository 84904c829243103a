"""Poison input is refused before any work: by gRPC itself (a message over the gateway's
4 MiB, at its length prefix, without the tarpit's 100-1000 ms), by the SDK before it
sends (INVALID_ARGUMENT naming the field), or by the gateway's checks (INVALID_ARGUMENT
naming the field), quickly, while a normal stream keeps flowing and the gateway's
memory stays where it was. Malformed protobuf is INVALID_ARGUMENT without Python's
exception text."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest

from sloserve.client import AsyncClient, Client, InvalidArgument, Unavailable
from sloserve.services.drills.poison import BIG, run_poison
from sloserve.services.gateway.validate import (
    InputLimits,
    InvalidInput,
    Limits,
    check_request,
)
from sloserve.services.proto import gateway_pb2
from sloserve.services.stack import Stack
from sloserve.services.store import free_port

LIMITS = Limits(max_tokens_total=8192, vocab_size=256)
MiB = 1 << 20


def _req(**kw: object) -> gateway_pb2.GenerateRequest:
    base: dict[str, object] = {"prompt": "hi", "max_tokens": 4}
    return gateway_pb2.GenerateRequest(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "field"), [
    ({"request_id": "x" * 129}, "request_id"),
    ({"request_id": "a b"}, "request_id"),
    ({"request_id": "é"}, "request_id"),
    ({"prompt": "p" * (MiB + 1)}, "prompt"),
    ({"prompt": "é" * (MiB // 2 + 1)}, "prompt"),  # under the limit in characters, over in bytes
    ({"prompt": "", "prompt_token_ids": [1] * 8193}, "prompt_token_ids"),
    ({"prompt_token_ids": [1]}, "prompt"),  # both
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**9}, "max_tokens"),
    ({"ttft_slo": 1e308}, "ttft_slo"),
    ({"tbt_slo": 5e-324}, "tbt_slo"),
    ({"jct_slo": math.nan}, "jct_slo"),
    ({"ttft_slo": -1.0}, "ttft_slo"),
    ({"tbt_slo": math.inf}, "tbt_slo"),
])
def test_check_request_names_the_field_of_each_poison_input(
    fields: dict[str, object], field: str,
) -> None:
    with pytest.raises(InvalidInput, match=f"^{field}: "):
        check_request(_req(**fields), LIMITS)


def test_check_request_accepts_the_bounds_themselves() -> None:
    check_request(_req(request_id="A-z_0.9:" + "x" * 120, ttft_slo=1e-3, tbt_slo=3600.0,
                       max_tokens=8192, prompt="p" * MiB), LIMITS)


def test_input_limits_refuse_nonsense_bounds() -> None:
    with pytest.raises(ValueError, match="max_prompt_bytes"):
        InputLimits(max_prompt_bytes=0)
    with pytest.raises(ValueError, match="min_slo_s"):
        InputLimits(min_slo_s=10.0, max_slo_s=1.0)


def test_poison_inputs_are_refused_fast_while_a_normal_stream_flows(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi", time_scale=2.0)
    run = run_poison(stack)
    lat = {k: v[0] for k, v in run.latencies.items()}
    # refused before any work: generous bounds (a shared 2-core machine), the
    # measured figures are in docs/reliability.md
    assert max(v for k, v in lat.items() if k not in BIG) < 2.0, lat
    assert max(lat[k] for k in BIG) < 5.0, lat  # mostly this process building the message
    for name, refusals in run.refusals.items():
        # gRPC refused it at its length prefix: the stream ended after 16 KB of the
        # message, and without the tarpit (which holds every refusal 100-1000 ms)
        assert all(r.sent_bytes == 16384 and r.frames[-1] in ("HEADERS+END_STREAM", "RST_STREAM")
                   for r in refusals), (name, refusals)
        assert min(r.seconds for r in refusals) < 0.08, (name, refusals)
    assert run.during and max(run.during) < run.median_gap + 0.5, (max(run.during),
                                                                   run.median_gap)
    assert run.rss_settled < 1.5 * run.rss_before, (run.rss_before, run.rss_settled)
    print("poison latencies ms:", {k: round(v * 1e3, 1) for k, v in lat.items()},
          "at the frame level ms:", {k: [round(r.seconds * 1e3, 1) for r in v]
                                     for k, v in run.refusals.items()},
          "normal stream gap ms: median", round(run.median_gap * 1e3, 1),
          "max during poison", round(max(run.during) * 1e3, 1),
          "max after", round(max(run.after, default=0) * 1e3, 1),
          "gateway RSS MB before/after/settled", round(run.rss_before / 1e6, 1),
          round(run.rss_after / 1e6, 1), round(run.rss_settled / 1e6, 1))
    assert stack.exited() == []


@pytest.mark.parametrize(("kw", "field"), [
    ({"prompt": "p" * (5 * MiB)}, "prompt"),
    ({"prompt": "é" * (3 * MiB)}, "prompt"),  # 3 Mi characters, 6 MiB of UTF-8
    ({"prompt": "hi", "request_id": "r" * (17 * MiB)}, "request_id"),
    ({"messages": [{"role": "user", "content": "c" * MiB}] * 5}, "messages"),
    ({"prompt_token_ids": [100_000] * (2 * MiB)}, "prompt_token_ids"),
])
def test_the_sdk_refuses_a_request_over_the_message_limit_before_sending_it(
    kw: dict[str, object], field: str,
) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: anything sent would be UNAVAILABLE
    prompt = kw.pop("prompt", None)
    with Client(dead) as client, pytest.raises(InvalidArgument, match=f"^{field}: ") as info:
        list(client.generate(prompt, timeout=5, **kw))  # type: ignore[arg-type]
    assert "4194304 bytes" in info.value.details

    async def via_async() -> None:
        async with AsyncClient(dead) as ac:
            async for _ in ac.generate(prompt, timeout=5, **kw):  # type: ignore[arg-type]
                pass

    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        asyncio.run(via_async())


def test_the_sdk_sends_a_request_under_the_limit_and_its_check_can_be_moved() -> None:
    dead = f"127.0.0.1:{free_port()}"
    with Client(dead) as client, pytest.raises(Unavailable):  # checked, then sent
        list(client.generate("p" * MiB, timeout=5))
    with Client(dead, max_request_bytes=None) as client, pytest.raises(Unavailable):
        list(client.generate("p" * (5 * MiB), timeout=5))
    with Client(dead, max_request_bytes=1000) as client, \
            pytest.raises(InvalidArgument, match="^prompt: .* 1000 bytes"):
        list(client.generate("p" * 1001, timeout=5))


@pytest.mark.parametrize(("kw", "field"), [
    ({"prompt": "he\ud800llo"}, "prompt"),
    ({"prompt": "hi", "stop": ["x", "\udfff"]}, "stop[1]"),
    ({"prompt": "hi", "stop": "\ud800"}, "stop[0]"),
    ({"messages": [{"role": "user", "content": "a\udc00"}]}, "messages[0].content"),
])
def test_the_sdk_names_the_field_holding_a_lone_surrogate_before_sending(
        kw: dict[str, object], field: str) -> None:
    """Issue 36, item 1: protobuf's UTF-8 strings cannot hold one; the SDK says where it is
    (InvalidArgument, as the gateway would) instead of raising UnicodeEncodeError."""
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: anything sent would be UNAVAILABLE
    prompt = kw.pop("prompt", None)
    with Client(dead) as client, pytest.raises(InvalidArgument) as info:
        list(client.generate(prompt, timeout=5, **kw))  # type: ignore[arg-type]
    assert info.value.details.startswith(f"{field}: not valid Unicode (a lone surrogate")
