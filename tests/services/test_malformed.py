"""The MalformedRequests interceptor on every method kind: well-formed calls are served
as before (reflection's request stream included), malformed ones answer INVALID_ARGUMENT
naming the message type, never UNKNOWN with Python's exception text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from sloserve.services.malformed import MalformedRequests

BAD = b"\xff\xff\xff\xff"


async def _scenario() -> dict[str, str]:
    server = grpc.aio.server(interceptors=[MalformedRequests()])
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection((health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    out: dict[str, str] = {}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            ok = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            out["check"] = health_pb2.HealthCheckResponse.ServingStatus.Name(ok.status)

            async def one_list() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
                yield reflection_pb2.ServerReflectionRequest(list_services="")

            async for resp in reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                    one_list()):
                out["reflection"] = ",".join(
                    sorted(s.name for s in resp.list_services_response.service))
            raw = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
            calls = {
                "unary": ch.unary_unary("/grpc.health.v1.Health/Check", **raw)(BAD),
                "unary_stream": ch.unary_stream("/grpc.health.v1.Health/Watch", **raw)(BAD),
            }

            async def bad_stream() -> AsyncIterator[bytes]:
                yield BAD

            calls["stream_stream"] = ch.stream_stream(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", **raw)(
                    bad_stream())
            for name, call in calls.items():
                try:
                    if name == "unary":
                        await call
                    else:
                        async for _ in call:
                            pass
                    out[name] = "OK"
                except grpc.aio.AioRpcError as exc:
                    out[name] = f"{exc.code().name}: {exc.details()}"
    finally:
        await server.stop(0)
    return out


def test_malformed_requests_answer_invalid_argument_on_every_method_kind() -> None:
    out = asyncio.run(_scenario())
    assert out["check"] == "SERVING"
    assert out["reflection"] == "grpc.health.v1.Health,grpc.reflection.v1alpha.ServerReflection"
    assert out["unary"] == (
        "INVALID_ARGUMENT: request: not a valid grpc.health.v1.HealthCheckRequest")
    assert out["unary_stream"] == out["unary"]
    assert out["stream_stream"] == ("INVALID_ARGUMENT: request: not a valid "
                                    "grpc.reflection.v1alpha.ServerReflectionRequest")
