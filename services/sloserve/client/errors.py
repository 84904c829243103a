"""Typed SDK errors: each carries the gRPC status code and the server's message."""

from __future__ import annotations

import grpc


class SloserveError(Exception):
    """A failed call; ``code`` is the ``grpc.StatusCode``, ``details`` the server message."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code


class InvalidArgument(SloserveError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class AlreadyExists(SloserveError):
    code = grpc.StatusCode.ALREADY_EXISTS


class RequestDropped(SloserveError):
    """The request was shed at admission or dropped under overload (Ascendra §6.3);
    ``retry_after``: seconds the gateway asks to wait before trying again (its
    ``grpc-retry-pushback-ms``), ``None`` if it said nothing."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, details: str, code: grpc.StatusCode | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(details, code)
        self.retry_after = retry_after


class Cancelled(SloserveError):
    code = grpc.StatusCode.CANCELLED


class NotFound(SloserveError):
    """``attach``: the gateway holds no request by that id."""

    code = grpc.StatusCode.NOT_FOUND


class Aborted(SloserveError):
    """``attach``: a request restored after a restart that ended before a client
    re-attached (issue 34, item 6); the details say how."""

    code = grpc.StatusCode.ABORTED


class Unavailable(SloserveError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(SloserveError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(SloserveError):
    """No valid API key (``authorization: Bearer <key>``)."""

    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: dict[grpc.StatusCode, type[SloserveError]] = {
    c.code: c
    for c in (InvalidArgument, AlreadyExists, RequestDropped, Cancelled, Unavailable,
              DeadlineExceeded, Unauthenticated, NotFound, Aborted)
}


PUSHBACK_METADATA = "grpc-retry-pushback-ms"  # gRFC A6's server pushback


def pushback_s(exc: grpc.RpcError) -> float | None:
    """The server's retry pushback on ``exc``, in seconds (``None``: none or malformed)."""
    trailing = getattr(exc, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == PUSHBACK_METADATA:
            try:
                ms = int(value)
            except (TypeError, ValueError):
                return None
            return ms / 1000.0 if ms >= 0 else None
    return None


def from_rpc_error(exc: grpc.RpcError) -> SloserveError:
    code: grpc.StatusCode = exc.code()
    details: str = exc.details() or code.name
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RequestDropped(details, code, retry_after=pushback_s(exc))
    return _BY_CODE.get(code, SloserveError)(details, code)
