"""Who may call what: API keys at the gateway, a shared token on the internal plane.

* **API keys** (clients → gateway): gRPC metadata ``authorization: Bearer <key>``,
  keys from ``$SLOSERVE_API_KEYS`` (comma or whitespace separated) and/or a file
  (``--api-key-file``, one key per line, ``#`` comments). There is never a default
  key: with none configured, auth is off and the gateway says so in one log line
  (vLLM's ``--api-key`` behaves the same way).
* **Internal token** (gateway → scheduler → executor, and perf-model): the same
  header carrying ``$SLOSERVE_INTERNAL_TOKEN``, which ``sloserve up`` generates per
  run and hands to its children through the environment. Every internal channel
  (:func:`sloserve.services.rpc.channel`) sends it; every internal server rejects a
  call without it with UNAUTHENTICATED before any handler runs, so a rogue process
  cannot open a stream. Health checking and reflection are exempt (probes and
  supervisors see only SERVING/NOT_SERVING; the schema is public).

Keys are compared in constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import grpc

API_KEYS_ENV = "SLOSERVE_API_KEYS"
API_KEY_ENV = "SLOSERVE_API_KEY"  # the client SDK's default key
INTERNAL_TOKEN_ENV = "SLOSERVE_INTERNAL_TOKEN"
HEADER = "authorization"
SCHEME = "Bearer "
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")  # public anyway


def new_token() -> str:
    """A fresh internal token (256 bits)."""
    return secrets.token_urlsafe(32)


def internal_token() -> str | None:
    """``$SLOSERVE_INTERNAL_TOKEN``, or ``None``: the internal plane is open (tests, dev)."""
    return os.environ.get(INTERNAL_TOKEN_ENV) or None


def _split(raw: str) -> list[str]:
    return [k for k in raw.replace(",", " ").split() if k]


def load_api_keys(path: str | None = None, env: str | None = None) -> frozenset[str]:
    """The gateway's API keys: ``$SLOSERVE_API_KEYS`` plus the lines of ``path``.

    An empty set means auth is off. A missing or unreadable file is a ``ValueError``
    naming ``--api-key-file`` (the gateway does not start open by mistake)."""
    raw = os.environ.get(API_KEYS_ENV, "") if env is None else env
    keys = set(_split(raw))
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"--api-key-file: cannot read {path}: {exc.strerror}") from None
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.add(line)
    return frozenset(keys)


def key_id(key: str) -> str:
    """A key's short, non-secret identity (logs, request ownership)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def bearer(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The credential of ``authorization: Bearer <credential>``, if present."""
    for k, v in metadata or ():
        if k == HEADER and isinstance(v, str) and v.startswith(SCHEME):
            return v[len(SCHEME):].strip()
    return None


def metadata(credential: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``credential`` (none when it is ``None``)."""
    return () if not credential else ((HEADER, SCHEME + credential),)


def _matches(credential: str | None, accepted: Sequence[bytes]) -> bool:
    if credential is None:
        return False
    c = credential.encode()
    found = False
    for k in accepted:  # every key compared: the time does not tell which one matched
        found |= hmac.compare_digest(c, k)
    return found


def _ignore(_: bytes) -> None:
    return None


def _denied(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that answers UNAUTHENTICATED and does nothing else
    (the request bytes are not even parsed)."""
    des, ser = _ignore, handler.response_serializer

    async def deny(_: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def deny_stream(_: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield None  # pragma: no cover - abort raises

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, des, ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny_stream, des, ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, des, ser)
    return grpc.stream_stream_rpc_method_handler(deny_stream, des, ser)


class BearerAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every method but the health service's requires ``authorization: Bearer <k>`` with
    ``k`` one of ``accepted``; anything else is UNAUTHENTICATED before a handler runs."""

    def __init__(self, accepted: Iterable[str], what: str = "credential") -> None:
        self.accepted = tuple(k.encode() for k in accepted)
        if not self.accepted:
            raise ValueError("BearerAuth: no credentials to accept (auth off: no interceptor)")
        self.what = what

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(EXEMPT_PREFIXES):
            return handler
        credential = bearer(handler_call_details.invocation_metadata)
        if _matches(credential, self.accepted):
            return handler
        why = "missing" if credential is None else "invalid"
        return _denied(handler, f"{why} {self.what} (authorization: Bearer ...)")


def internal_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The internal servers' interceptor when ``$SLOSERVE_INTERNAL_TOKEN`` is set."""
    token = internal_token()
    return [] if token is None else [BearerAuth([token], "internal token")]


class _Sending:
    """A multi-callable that adds the credential to every call's metadata."""

    def __init__(self, inner: Any, pair: tuple[str, str]) -> None:
        self._inner, self._pair = inner, pair

    def __call__(self, *args: Any, metadata: Any = None, **kw: Any) -> Any:
        return self._inner(*args, metadata=(*(metadata or ()), self._pair), **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CredentialChannel:
    """An aio channel whose every call carries ``authorization: Bearer <credential>``.

    Not a client interceptor: gRPC's aio interceptors put every message of a stream
    through an extra queue (the scheduler's per-batch plan stream would pay it); this
    only adds one metadata pair when a call starts. Everything else is the channel's."""

    def __init__(self, channel: grpc.aio.Channel, credential: str) -> None:
        self._channel, self._pair = channel, (HEADER, SCHEME + credential)

    def unary_unary(self, *args: Any, **kw: Any) -> Any:
        return _Sending(self._channel.unary_unary(*args, **kw), self._pair)

    def unary_stream(self, *args: Any, **kw: Any) -> Any:
        return _Sending(self._channel.unary_stream(*args, **kw), self._pair)

    def stream_unary(self, *args: Any, **kw: Any) -> Any:
        return _Sending(self._channel.stream_unary(*args, **kw), self._pair)

    def stream_stream(self, *args: Any, **kw: Any) -> Any:
        return _Sending(self._channel.stream_stream(*args, **kw), self._pair)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    async def __aenter__(self) -> CredentialChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close()


def sending(channel: grpc.aio.Channel, credential: str | None) -> grpc.aio.Channel:
    """``channel``, sending ``credential`` on every call when there is one."""
    if not credential:
        return channel
    return cast(grpc.aio.Channel, CredentialChannel(channel, credential))
