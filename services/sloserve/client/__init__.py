"""Python SDK for the sloserve gateway.

    from sloserve.client import Client
    for chunk in Client("127.0.0.1:50051").generate("Hello", max_tokens=16, tbt_slo=0.1):
        print(chunk.text, end="", flush=True)
    chat = [{"role": "user", "content": "Hi"}]
    for chunk in Client().generate(messages=chat, temperature=0, stop=["\\n"]):
        print(chunk.text, end="", flush=True)

Every failure raises a :class:`SloserveError` subclass carrying the gRPC status.
"""

from sloserve.client.client import AsyncClient, Chunk, Client
from sloserve.client.errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    RequestDropped,
    SloserveError,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "Aborted",
    "AlreadyExists",
    "AsyncClient",
    "Cancelled",
    "Chunk",
    "Client",
    "DeadlineExceeded",
    "InvalidArgument",
    "NotFound",
    "RequestDropped",
    "SloserveError",
    "Unauthenticated",
    "Unavailable",
]
