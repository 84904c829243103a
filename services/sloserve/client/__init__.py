"""Python SDK for the sloserve gateway.

    from sloserve.client import Client
    for chunk in Client("127.0.0.1:50051").generate("Hello", max_tokens=16, tbt_slo=0.1):
        print(chunk.text, end="", flush=True)

Every failure raises a :class:`SloserveError` subclass carrying the gRPC status.
"""

from sloserve.client.client import AsyncClient, Chunk, Client
from sloserve.client.errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    RequestDropped,
    SloserveError,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "Cancelled",
    "Chunk",
    "Client",
    "DeadlineExceeded",
    "InvalidArgument",
    "RequestDropped",
    "SloserveError",
    "Unauthenticated",
    "Unavailable",
]
