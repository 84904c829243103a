"""A hostile gRPC client at the HTTP/2 frame level: it declares a huge message in the
5-byte gRPC length prefix, sends only the first 16 KB of it, and times the server's
answer (RFC 9113 framing, HPACK literals without Huffman coding, RFC 7541 §6.2.2).

gRPC's own clients build the whole message in memory before its first byte leaves, so
the time they report for an oversized request is mostly their own; this one measures
the server: from the first DATA frame to the end of the stream (trailers or RST_STREAM).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's default


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream) + payload


def _literal(index: int, value: str) -> bytes:
    """A header field without indexing, its name from the static table (``index``)."""
    raw = value.encode()
    assert index < 15 and len(raw) < 127
    return bytes([index, len(raw)]) + raw


def _headers(authority: str, path: str, metadata: tuple[tuple[str, str], ...]) -> bytes:
    block = (b"\x83\x86"  # :method POST, :scheme http
             + _literal(4, path) + _literal(1, authority)  # :path, :authority
             + b"\x0f\x10" + bytes([16]) + b"application/grpc")  # content-type (index 31)
    for name, value in (("te", "trailers"), *metadata):
        n, v = name.encode(), value.encode()
        block += b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v
    return block


@dataclass(frozen=True, slots=True)
class Refusal:
    seconds: float  # from the first DATA frame sent to the end of the stream
    sent_bytes: int  # of the message, prefix included, when the answer came
    frames: tuple[str, ...]  # what the server sent on the stream: "HEADERS+END_STREAM", ...


def send_oversized(host: str, port: int, path: str, declared: int, timeout: float = 5.0,
                   metadata: tuple[tuple[str, str], ...] = ()) -> Refusal:
    """Open a connection, start a call to ``path`` whose message is ``declared`` bytes long,
    send the first frame of it only, and wait for the server to end the stream."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as gRPC: no Nagle delay
        s.sendall(PREFACE + _frame(SETTINGS, 0, 0))
        s.sendall(_frame(HEADERS, END_HEADERS, 1, _headers(f"{host}:{port}", path, metadata)))
        first = struct.pack(">BI", 0, declared) + b"r" * (FRAME - 5)
        t0 = time.perf_counter()
        s.sendall(_frame(DATA, 0, 1, first))
        frames: list[str] = []
        buf = b""
        while True:
            while len(buf) < 9:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError(f"closed before the stream ended: {frames}")
                buf += chunk
            length = int.from_bytes(buf[:3], "big")
            kind, flags, stream = buf[3], buf[4], struct.unpack(">I", buf[5:9])[0] & 0x7FFFFFFF
            while len(buf) < 9 + length:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError(f"closed before the stream ended: {frames}")
                buf += chunk
            payload, buf = buf[9:9 + length], buf[9 + length:]
            if kind == SETTINGS and not flags & ACK:
                s.sendall(_frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                s.sendall(_frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                raise ConnectionError(f"GOAWAY {payload[8:]!r}")
            if stream != 1:
                continue
            name = {HEADERS: "HEADERS", RST_STREAM: "RST_STREAM", DATA: "DATA"}.get(kind, str(kind))
            frames.append(name + ("+END_STREAM" if kind in (HEADERS, DATA)
                                  and flags & END_STREAM else ""))
            if kind == RST_STREAM or (kind in (HEADERS, DATA) and flags & END_STREAM):
                return Refusal(time.perf_counter() - t0, len(first), tuple(frames))
