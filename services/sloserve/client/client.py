"""``Client`` (blocking) and ``AsyncClient`` (asyncio) over the Gateway service."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import grpc
from typing_extensions import Unpack

from sloserve.client.errors import InvalidArgument, from_rpc_error
from sloserve.services import auth
from sloserve.services.gateway.validate import MAX_MESSAGE_BYTES
from sloserve.services.proto import common_pb2, gateway_grpc, gateway_pb2
from sloserve.services.rpc import client_options
from sloserve.services.tls import client_credentials


@dataclass(frozen=True, slots=True)
class Chunk:
    """One output token. ``time``/``arrival_time`` are the gateway's clock (seconds)."""

    request_id: str
    index: int
    token_id: int
    text: str
    time: float
    arrival_time: float
    finish_reason: str | None  # None while streaming; "length" or "stop" on the last chunk
    instance_id: str
    num_offloads: int
    produced_time: float  # when the instance's iteration produced it (before the gateway hop)


class GenerateOptions(TypedDict, total=False):
    """Keyword options of ``generate`` (both clients). SLOs in seconds; sampling as vLLM's."""

    prompt_token_ids: Sequence[int]  # instead of a text prompt
    max_tokens: int  # default 16
    ttft_slo: float  # unset: the gateway's default
    tbt_slo: float
    jct_slo: float
    priority: int  # higher = more urgent
    request_id: str  # default: the gateway assigns one
    temperature: float  # 0 = greedy; unset: 1.0
    top_p: float
    top_k: int  # -1 or 0: off (vLLM)
    seed: int
    ignore_eos: bool  # generate exactly max_tokens
    stop_token_ids: Sequence[int]
    stop: str | Sequence[str]  # stop strings (not returned), matched at the gateway
    messages: Sequence[Mapping[str, str]]  # a chat ({"role", "content"}) instead of a prompt
    n: int  # 1 only (one output per request)


def _request(prompt: str | None, opts: GenerateOptions,
             max_bytes: int | None = None) -> gateway_pb2.GenerateRequest:
    """The wire request; over ``max_bytes`` it is refused here (:func:`check_size`)."""
    if max_bytes is not None:  # a field alone over the limit: refused before it is copied
        for name, text in (("prompt", prompt), ("request_id", opts.get("request_id"))):
            if text is not None and len(text) > max_bytes:  # characters <= UTF-8 bytes
                raise InvalidArgument(
                    f"{name}: {len(text)} characters, over the gateway's message limit of "
                    f"{max_bytes} bytes (max_request_bytes)")
    try:
        msg = _build(prompt, opts)
    except UnicodeEncodeError:  # the wire's strings are UTF-8: say which field cannot be
        raise InvalidArgument(_lone_surrogate(prompt, opts)) from None
    if max_bytes is not None:
        check_size(msg, max_bytes)
    return msg


def _lone_surrogate(prompt: str | None, opts: GenerateOptions) -> str:
    """The message naming the text field that holds a lone surrogate (issue 36, item 1:
    the gateway's HTTP API names the same field)."""
    stop = opts.get("stop", ())
    texts = [("prompt", prompt), ("request_id", opts.get("request_id")),
             *((f"stop[{k}]", x) for k, x in enumerate([stop] if isinstance(stop, str)
                                                        else stop)),
             *((f"messages[{k}].{f}", m.get(f)) for k, m in enumerate(opts.get("messages", ()))
               for f in ("role", "content"))]
    for name, text in texts:
        if isinstance(text, str):
            try:
                text.encode()
            except UnicodeEncodeError as exc:
                return (f"{name}: not valid Unicode (a lone surrogate "
                        f"U+{ord(text[exc.start]):04X} at character {exc.start})")
    return "request: a text field is not valid Unicode"


def check_size(msg: gateway_pb2.GenerateRequest, max_bytes: int) -> None:
    """InvalidArgument if ``msg`` is over the gateway's gRPC message limit: gRPC would refuse
    it with RESOURCE_EXHAUSTED after this client had built and started sending it all."""
    n = msg.ByteSize()
    if n > max_bytes:
        sizes = {"prompt": len(msg.prompt), "request_id": len(msg.request_id),
                 "messages": sum(m.ByteSize() for m in msg.messages),
                 "prompt_token_ids": gateway_pb2.GenerateRequest(
                     prompt_token_ids=msg.prompt_token_ids).ByteSize()}
        field = max(sizes, key=lambda k: sizes[k])
        raise InvalidArgument(f"{field}: the request is {n} bytes, over the gateway's message "
                              f"limit of {max_bytes} bytes (max_request_bytes)")


def _build(prompt: str | None, opts: GenerateOptions) -> gateway_pb2.GenerateRequest:
    if opts.get("n", 1) != 1:
        raise ValueError(f"n: only n=1 is supported, got {opts.get('n')}")
    stop = opts.get("stop", ())
    msg = gateway_pb2.GenerateRequest(
        max_tokens=opts.get("max_tokens", 16), priority=opts.get("priority", 0),
        request_id=opts.get("request_id") or "", multi_token=True,
        sampling=sampling(opts.get("temperature"), opts.get("top_p"), opts.get("top_k"),
                          opts.get("seed"), opts.get("ignore_eos", False),
                          opts.get("stop_token_ids", ()),
                          [stop] if isinstance(stop, str) else stop))
    for k, m in enumerate(opts.get("messages", ())):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{k}]: needs a string role and content")
        msg.messages.add(role=m["role"], content=m["content"])
    if prompt is not None:
        msg.prompt = prompt
    if "prompt_token_ids" in opts:
        msg.prompt_token_ids.extend(opts["prompt_token_ids"])
    for name in ("ttft_slo", "tbt_slo", "jct_slo"):
        value = opts.get(name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def sampling(
    temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
    seed: int | None = None, ignore_eos: bool = False, stop_token_ids: Sequence[int] = (),
    stop: Sequence[str] = (),
) -> common_pb2.Sampling:
    """The wire form of vLLM-style sampling parameters (unset: vLLM's defaults)."""
    msg = common_pb2.Sampling(ignore_eos=ignore_eos, stop_token_ids=list(stop_token_ids),
                              stop=list(stop))
    if temperature is not None:
        msg.temperature = temperature
    if top_p is not None:
        msg.top_p = top_p
    if top_k is not None:
        msg.top_k = top_k
    if seed is not None:
        msg.seed = seed
    return msg


def _chunks(c: gateway_pb2.GenerateChunk) -> list[Chunk]:
    """One :class:`Chunk` per token of a wire chunk (several with ``multi_token``, which
    the SDK asks for: fewer messages, every token still timed; issue 33, item 3)."""
    if not c.token_ids:  # a one-token chunk (a gateway that predates multi_token)
        return [Chunk(c.request_id, c.index, c.token_id, c.text, c.time, c.arrival_time,
                      c.finish_reason or None, c.instance_id, c.num_offloads,
                      c.produced_time)]
    ids, texts, times, produced = c.token_ids, c.texts, c.times, c.produced_times
    last = len(ids) - 1
    rid, arrival, inst, offl, base = (c.request_id, c.arrival_time, c.instance_id,
                                      c.num_offloads, c.index)
    return [Chunk(rid, base + i, ids[i], texts[i], times[i], arrival,
                  (c.finish_reason or None) if i == last else None, inst, offl, produced[i])
            for i in range(last + 1)]


def _info(r: gateway_pb2.InfoResponse) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    info: dict[str, Any] = MessageToDict(r, preserving_proto_field_name=True)
    return info


def _auth_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    """``authorization: Bearer <key>``: ``api_key``, else ``$SLOSERVE_API_KEY``, else none."""
    return auth.metadata(api_key or os.environ.get(auth.API_KEY_ENV) or None)


class Client:
    """Blocking client: ``generate`` yields :class:`Chunk` objects as tokens are produced.

    ``max_request_bytes`` (default: the gateway's default gRPC message limit; None: no
    check): a request over it raises :class:`InvalidArgument` naming its biggest field
    before anything is sent. ``tls_ca`` (else ``$SLOSERVE_TLS_CA``): connect over TLS,
    trusting this CA file (issue 34); neither: plaintext."""

    def __init__(self, target: str = "127.0.0.1:50051", api_key: str | None = None,
                 max_request_bytes: int | None = MAX_MESSAGE_BYTES,
                 tls_ca: str | None = None) -> None:
        self._max_bytes = max_request_bytes
        self._md = _auth_metadata(api_key)
        creds = client_credentials(tls_ca)
        self._channel = (grpc.insecure_channel(target, options=client_options())
                         if creds is None else
                         grpc.secure_channel(target, creds, options=client_options()))
        self._stub = gateway_grpc.GatewayStub(self._channel)

    def generate(
        self, prompt: str | None = None, *, timeout: float | None = None,
        **opts: Unpack[GenerateOptions],
    ) -> Iterator[Chunk]:
        call = self._stub.Generate(_request(prompt, opts, self._max_bytes), timeout=timeout,
                                  metadata=self._md)
        try:
            for c in call:
                yield from _chunks(c)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        finally:
            call.cancel()  # no-op when complete; frees the request if the caller stopped early

    def attach(self, request_id: str, start_index: int = 0, *,
               timeout: float | None = None) -> Iterator[Chunk]:
        """Re-attach to ``request_id`` after the stack restarted (issue 34, item 6): its
        chunks from ``start_index`` (the count already received) to the end. Raises
        :class:`NotFound` for an id the gateway does not hold, :class:`Unavailable` while
        its instances reconnect (retry), or the status the request ended with."""
        call = self._stub.Attach(gateway_pb2.AttachRequest(
            request_id=request_id, start_index=start_index), timeout=timeout, metadata=self._md)
        try:
            for c in call:
                yield from _chunks(c)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        finally:
            call.cancel()

    def cancel(self, request_id: str) -> bool:
        try:
            return bool(self._stub.Cancel(gateway_pb2.CancelRequest(request_id=request_id),
                                 metadata=self._md).found)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def info(self) -> dict[str, Any]:
        try:
            return _info(self._stub.Info(gateway_pb2.InfoRequest(), metadata=self._md))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """asyncio client: ``async for chunk in client.generate(...)`` (``max_request_bytes``:
    as :class:`Client`'s)."""

    def __init__(self, target: str = "127.0.0.1:50051", api_key: str | None = None,
                 max_request_bytes: int | None = MAX_MESSAGE_BYTES,
                 tls_ca: str | None = None) -> None:
        self._max_bytes = max_request_bytes
        self._md = _auth_metadata(api_key)
        creds = client_credentials(tls_ca)
        self._channel = (grpc.aio.insecure_channel(target, options=client_options())
                         if creds is None else
                         grpc.aio.secure_channel(target, creds, options=client_options()))
        self._stub = gateway_grpc.GatewayStub(self._channel)

    async def generate(
        self, prompt: str | None = None, *, timeout: float | None = None,
        **opts: Unpack[GenerateOptions],
    ) -> AsyncIterator[Chunk]:
        call = self._stub.Generate(_request(prompt, opts, self._max_bytes), timeout=timeout,
                                  metadata=self._md)
        try:
            async for c in call:
                for chunk in _chunks(c):
                    yield chunk
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        finally:
            call.cancel()

    async def attach(self, request_id: str, start_index: int = 0, *,
                     timeout: float | None = None) -> AsyncIterator[Chunk]:
        """As :meth:`Client.attach`."""
        call = self._stub.Attach(gateway_pb2.AttachRequest(
            request_id=request_id, start_index=start_index), timeout=timeout, metadata=self._md)
        try:
            async for c in call:
                for chunk in _chunks(c):
                    yield chunk
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        finally:
            call.cancel()

    async def cancel(self, request_id: str) -> bool:
        try:
            resp = await self._stub.Cancel(gateway_pb2.CancelRequest(request_id=request_id),
                                 metadata=self._md)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return bool(resp.found)

    async def info(self) -> dict[str, Any]:
        try:
            return _info(await self._stub.Info(gateway_pb2.InfoRequest(), metadata=self._md))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
