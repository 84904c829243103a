"""Malformed request messages answer INVALID_ARGUMENT, not UNKNOWN with Python's text.

grpc's aio server reports a request deserializer's exception as ``UNKNOWN:
Unexpected <class 'google.protobuf.message.DecodeError'>: ...``. The
:class:`MalformedRequests` interceptor swaps each method's deserializer for one
that returns the :data:`MALFORMED` marker instead of raising, and its behaviour
for one that aborts with ``INVALID_ARGUMENT: request: not a valid <Message>``
when it sees the marker (for a request stream: at the malformed message).
Installed on the gateway, the server that faces clients.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Malformed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MALFORMED"


MALFORMED = _Malformed()
Deserializer = Callable[[bytes], Any]


def _lenient(deserialize: Deserializer) -> Deserializer:
    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except (DecodeError, ValueError, TypeError):
            return MALFORMED

    return parse


def _message_name(deserialize: Deserializer | None) -> str:
    owner = getattr(deserialize, "__self__", None)  # ``Message.FromString`` is a classmethod
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "request message"))


async def _reject(context: grpc.aio.ServicerContext, name: str) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid {name}")


def _guard(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    des = handler.request_deserializer
    if des is None:
        return handler
    name = _message_name(des)
    ser = handler.response_serializer
    if handler.unary_unary is not None:
        uu = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if request is MALFORMED:
                await _reject(context, name)
            return await uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, _lenient(des), ser)
    if handler.unary_stream is not None:
        us = handler.unary_stream
        if inspect.isasyncgenfunction(us):
            async def unary_stream(request: Any, context: grpc.aio.ServicerContext
                                   ) -> AsyncIterator[Any]:
                if request is MALFORMED:
                    await _reject(context, name)
                async for response in us(request, context):
                    yield response

            return grpc.unary_stream_rpc_method_handler(unary_stream, _lenient(des), ser)

        async def unary_stream_writer(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if request is MALFORMED:
                await _reject(context, name)
            return await us(request, context)

        return grpc.unary_stream_rpc_method_handler(unary_stream_writer, _lenient(des), ser)

    def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
                ) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            async for request in requests:
                if request is MALFORMED:
                    await _reject(context, name)
                yield request

        return gen()

    if handler.stream_unary is not None:
        su = handler.stream_unary

        async def stream_unary(requests: AsyncIterator[Any],
                               context: grpc.aio.ServicerContext) -> Any:
            return await su(checked(requests, context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, _lenient(des), ser)
    ss = handler.stream_stream
    if ss is None:
        return handler
    if inspect.isasyncgenfunction(ss):
        async def stream_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
                                ) -> AsyncIterator[Any]:
            async for response in ss(checked(requests, context), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, _lenient(des), ser)

    async def stream_stream_writer(requests: AsyncIterator[Any],
                                   context: grpc.aio.ServicerContext) -> Any:
        return await ss(checked(requests, context), context)

    return grpc.stream_stream_rpc_method_handler(stream_stream_writer, _lenient(des), ser)


class MalformedRequests(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every method of the server answers a malformed request with INVALID_ARGUMENT."""

    def __init__(self) -> None:
        self._guarded: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method in self._guarded:
            return self._guarded[method]
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: UNIMPLEMENTED (not cached: names are the caller's)
            return None
        guarded = self._guarded[method] = _guard(handler)
        return guarded
