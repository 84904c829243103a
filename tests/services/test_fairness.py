"""Per-tenant fairness at the gateway (issue 36, item 7): one API key floods at 5x its
normal rate, another sends at its normal rate; with per-key limits (a token bucket per
key over prompt + max_tokens, and a bound on requests in flight) the flood is refused
with RESOURCE_EXHAUSTED and a retry hint (gRPC ``grpc-retry-pushback-ms``, HTTP 429
``Retry-After``), and the other key's requests keep their SLOs.

The stack is ``test_overload``'s (sim backend slowed 4x, sarathi, one instance,
1024-token prompts, 32 output tokens: capacity 2.75 req/s). Each key may use 40% of
it in tokens; key B sends at 30% of capacity, key A at 5x that (150%).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest

from sloserve.client import Client, RequestDropped
from sloserve.services.drills.fairness import KEY_A, KEY_B, LIMITS, keys_file, run_fairness
from sloserve.services.drills.overload import STACK
from sloserve.services.proto import gateway_grpc, gateway_pb2
from sloserve.services.stack import Stack
from sloserve.services.store import free_port
from sloserve.tenancy import KeyLimits


def test_a_flooding_key_is_held_to_its_share_and_the_other_key_keeps_its_slos(
    start_stack: Callable[..., Stack], tmp_path: Path,
) -> None:
    stack = start_stack(**STACK, api_key_file=keys_file(tmp_path), key_limits=LIMITS)
    out = run_fairness(stack, duration_s=30.0)
    a, b = out["flooding_key"], out["normal_key"]
    print(f"\nfairness: key B {b['met_slo']}/{b['sent']} met their SLOs; key A "
          f"{a['completed']}/{a['sent']} served, {a['shed']} refused")
    assert not a["errors"] and not b["errors"], out
    assert b["slo_attainment"] >= 0.9, out  # 0.70 without per-key limits (measured)
    assert a["shed"] > 0.3 * a["sent"], out  # the flood is turned away ...
    assert any("this API key" in r for r in a["reasons"]), out  # ... by its own limit
    assert a["completed"] > 0.1 * a["sent"], out  # and still gets its share


def test_a_key_over_its_limits_gets_a_retry_hint_on_grpc_and_http(
    start_stack: Callable[..., Stack], tmp_path: Path,
) -> None:
    """Over the token rate: RESOURCE_EXHAUSTED + ``grpc-retry-pushback-ms``, HTTP 429 +
    ``Retry-After``; over the in-flight bound alike; the other key is served meanwhile."""
    stack = start_stack(policy="sarathi", time_scale=0.05, http_port=free_port(),
                        api_key_file=keys_file(tmp_path),
                        key_limits=KeyLimits(max_inflight=1, token_rate=2.0, token_burst=200))
    ok = list(Client(stack.gateway, api_key=KEY_A).generate(
        "hi", max_tokens=250, ignore_eos=True, timeout=30))
    assert len(ok) == 250  # bigger than the bucket, which was full: served, now in debt

    async def grpc_refusal() -> tuple[grpc.StatusCode, str, dict[str, str]]:
        async with grpc.aio.insecure_channel(stack.gateway) as ch:
            call = gateway_grpc.GatewayStub(ch).Generate(
                gateway_pb2.GenerateRequest(prompt="hi", max_tokens=50),
                metadata=(("authorization", f"Bearer {KEY_A}"),))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
            md = {k: str(v) for k, v in (err.value.trailing_metadata() or ())}
            return err.value.code(), err.value.details() or "", md

    code, details, md = asyncio.run(grpc_refusal())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "key_token_rate 2/s" in details
    assert int(md["grpc-retry-pushback-ms"]) > 1000, md  # tens of tokens short at 2/s
    r = httpx.post(stack.http + "/v1/completions", json={"prompt": "hi",
                   "max_tokens": 50}, headers={"authorization": f"Bearer {KEY_A}"}, timeout=30)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, (r, r.text)
    assert r.json()["error"]["type"] == "rate_limit_error"
    # key B is unaffected; with one of its requests in flight, its second is refused
    b = Client(stack.gateway, api_key=KEY_B)
    stream = b.generate("hi", max_tokens=150, ignore_eos=True, timeout=30)
    next(iter(stream))
    with pytest.raises(RequestDropped, match="max_inflight_per_key 1"):
        list(b.generate("hi", max_tokens=2, timeout=30))
    assert len(list(stream)) == 149  # the first is served to its end
    assert len(list(b.generate("hi", max_tokens=2, timeout=30))) == 2  # its slot is back
