"""Malformed request messages answer INVALID_ARGUMENT, not UNKNOWN with Python's text.

grpc's aio server reports a request deserializer's exception as ``UNKNOWN:
Unexpected <class 'google.protobuf.message.DecodeError'>: ...``. The
:class:`MalformedRequests` interceptor swaps each method's deserializer for one
that returns the :data:`MALFORMED` marker instead of raising, and its behaviour
for one that aborts with ``INVALID_ARGUMENT: request: not a valid <Message>``
when it sees the marker (for a request stream: at the malformed message).
Installed on the gateway, the server that faces clients. A string field that is not
UTF-8 (a lone surrogate's bytes, say) is named: ``prompt: not valid UTF-8`` (issue 36,
item 1; the HTTP API refuses the same input naming the same field).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError


class _Malformed:
    """A request that did not parse; ``field``: its string field that is not UTF-8."""

    __slots__ = ("field",)

    def __init__(self, field: str = "") -> None:
        self.field = field

    def __repr__(self) -> str:
        return f"MALFORMED({self.field})" if self.field else "MALFORMED"


MALFORMED = _Malformed()
Deserializer = Callable[[bytes], Any]


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        b = raw[pos]  # IndexError past the end: a truncated message
        value |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not b & 0x80:
            return value, pos


def bad_utf8_field(descriptor: Descriptor, raw: bytes, prefix: str = "") -> str:
    """The first string field of ``raw`` (a ``descriptor`` message, nested ones walked)
    whose bytes are not UTF-8, as ``sampling.stop``; "" if none or unreadable."""
    pos = 0
    try:
        while pos < len(raw):
            key, pos = _varint(raw, pos)
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, pos = _varint(raw, pos)
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            elif wire == 2:
                n, pos = _varint(raw, pos)
                chunk, pos = raw[pos:pos + n], pos + n
                f = descriptor.fields_by_number.get(number)
                if f is None:
                    continue
                if f.type == FieldDescriptor.TYPE_STRING:
                    try:
                        chunk.decode()
                    except UnicodeDecodeError:
                        return prefix + f.name
                elif f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type is not None:
                    if bad := bad_utf8_field(f.message_type, chunk, f"{prefix}{f.name}."):
                        return bad
            else:
                return ""  # groups: long obsolete, not ours
    except IndexError:
        return ""
    return ""


def _lenient(deserialize: Deserializer) -> Deserializer:
    descriptor = _descriptor(deserialize)

    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except (DecodeError, ValueError, TypeError):
            field = bad_utf8_field(descriptor, raw) if descriptor is not None else ""
            return _Malformed(field) if field else MALFORMED

    return parse


def _descriptor(deserialize: Deserializer | None) -> Descriptor | None:
    owner = getattr(deserialize, "__self__", None)  # ``Message.FromString`` is a classmethod
    d = getattr(owner, "DESCRIPTOR", None)
    return d if isinstance(d, Descriptor) else None


def _message_name(deserialize: Deserializer | None) -> str:
    descriptor = _descriptor(deserialize)
    return descriptor.full_name if descriptor is not None else "request message"


async def _reject(context: grpc.aio.ServicerContext, name: str, request: _Malformed) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"{request.field}: not valid UTF-8" if request.field
                        else f"request: not a valid {name}")


def _guard(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    des = handler.request_deserializer
    if des is None:
        return handler
    name = _message_name(des)
    ser = handler.response_serializer
    if handler.unary_unary is not None:
        uu = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                await _reject(context, name, request)
            return await uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, _lenient(des), ser)
    if handler.unary_stream is not None:
        us = handler.unary_stream
        if inspect.isasyncgenfunction(us):
            async def unary_stream(request: Any, context: grpc.aio.ServicerContext
                                   ) -> AsyncIterator[Any]:
                if isinstance(request, _Malformed):
                    await _reject(context, name, request)
                async for response in us(request, context):
                    yield response

            return grpc.unary_stream_rpc_method_handler(unary_stream, _lenient(des), ser)

        async def unary_stream_writer(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                await _reject(context, name, request)
            return await us(request, context)

        return grpc.unary_stream_rpc_method_handler(unary_stream_writer, _lenient(des), ser)

    def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
                ) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Malformed):
                    await _reject(context, name, request)
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
