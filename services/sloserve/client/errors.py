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
    """The policy dropped the request under overload (Ascendra §6.3)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Cancelled(SloserveError):
    code = grpc.StatusCode.CANCELLED


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
              DeadlineExceeded, Unauthenticated)
}


def from_rpc_error(exc: grpc.RpcError) -> SloserveError:
    code: grpc.StatusCode = exc.code()
    details: str = exc.details() or code.name
    return _BY_CODE.get(code, SloserveError)(details, code)
