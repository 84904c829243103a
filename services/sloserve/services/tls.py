"""Transport security (issue 34, item 1): TLS on the public ports, mutual TLS inside.

Public side: the gateway serves gRPC and HTTPS with ``--tls-cert``/``--tls-key``
(a PEM chain and its key); a client trusts them with a CA file (``Client(tls_ca=...)``,
``$SLOSERVE_TLS_CA``, ``curl --cacert``).

Internal plane (gateway, schedulers, executors, perf-model): with
``$SLOSERVE_INTERNAL_CA`` + ``$SLOSERVE_INTERNAL_CERT`` + ``$SLOSERVE_INTERNAL_KEY``
set, every internal server requires a client certificate signed by that CA and
every internal channel presents its service's own certificate (mutual TLS); a
peer without one is refused in the handshake, before any message. The internal
token (``auth.py``) stays as a second factor. ``sloserve up --tls-internal-dir DIR``
hands each child its own files: ``DIR/ca.pem`` and ``DIR/<service>.pem`` +
``DIR/<service>-key.pem``, where ``<service>`` is the stack's name for it
(``scheduler-lp0``) or, failing that, its kind (``scheduler``); ``up`` itself checks
health with ``DIR/up.pem``, else the gateway's. A certificate must name the address
its service is reached by (``127.0.0.1`` under ``up``).

Plaintext stays the default, on loopback only: :func:`check_bind` refuses a
non-loopback address without TLS unless ``--insecure`` is given.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc

TLS_CA_ENV = "SLOSERVE_TLS_CA"  # the SDK's (and `up`'s) trust for the public ports
INTERNAL_CA_ENV = "SLOSERVE_INTERNAL_CA"
INTERNAL_CERT_ENV = "SLOSERVE_INTERNAL_CERT"
INTERNAL_KEY_ENV = "SLOSERVE_INTERNAL_KEY"
INTERNAL_ENVS = (INTERNAL_CA_ENV, INTERNAL_CERT_ENV, INTERNAL_KEY_ENV)


def read_pem(path: str | Path, field: str) -> bytes:
    """The bytes of a PEM file; a missing or non-PEM file raises ``ValueError`` naming
    ``field``."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{field}: cannot read {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{field}: {path} is not a PEM file")
    return data


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """A public server's certificate chain and key (``--tls-cert``/``--tls-key``)."""

    cert: str
    key: str

    @classmethod
    def from_args(cls, cert: str | None, key: str | None) -> ServerTLS | None:
        """Both or neither (``None``: plaintext); one alone is an error naming the other."""
        if not cert and not key:
            return None
        if not cert or not key:
            given, missing = ("--tls-cert", "--tls-key") if cert else ("--tls-key", "--tls-cert")
            raise ValueError(f"{missing}: required with {given}")
        tls = cls(cert, key)
        tls.credentials()  # unreadable files fail here, before anything starts
        return tls

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(read_pem(self.key, "--tls-key"), read_pem(self.cert, "--tls-cert"))])


def client_credentials(ca: str | None) -> grpc.ChannelCredentials | None:
    """Channel credentials trusting ``ca`` (else ``$SLOSERVE_TLS_CA``); ``None``: plaintext."""
    ca = ca or os.environ.get(TLS_CA_ENV) or None
    if ca is None:
        return None
    return grpc.ssl_channel_credentials(root_certificates=read_pem(ca, "tls_ca"))


@dataclass(frozen=True, slots=True)
class MutualTLS:
    """One internal service's CA, certificate and key (mutual TLS on the internal plane)."""

    ca: str
    cert: str
    key: str

    @classmethod
    def from_env(cls) -> MutualTLS | None:
        """From ``$SLOSERVE_INTERNAL_{CA,CERT,KEY}``: all three or none (``None``: plaintext)."""
        values = [os.environ.get(name) or "" for name in INTERNAL_ENVS]
        if not any(values):
            return None
        missing = [n for n, v in zip(INTERNAL_ENVS, values) if not v]
        if missing:
            raise ValueError(f"${missing[0]}: required with ${INTERNAL_ENVS[0]}, "
                             f"${INTERNAL_ENVS[1]} and ${INTERNAL_ENVS[2]} (mutual TLS)")
        return cls(*values)

    @classmethod
    def from_dir(cls, directory: str | Path, *names: str) -> MutualTLS:
        """``ca.pem`` and the first of ``<name>.pem``/``<name>-key.pem`` present in
        ``directory`` (``--tls-internal-dir``); none present raises naming the files."""
        d = Path(directory)
        ca = d / "ca.pem"
        if not ca.is_file():
            raise ValueError(f"--tls-internal-dir: {ca} is missing")
        for name in names:
            cert, key = d / f"{name}.pem", d / f"{name}-key.pem"
            if cert.is_file() and key.is_file():
                return cls(str(ca), str(cert), str(key))
        wanted = " or ".join(f"{n}.pem + {n}-key.pem" for n in names)
        raise ValueError(f"--tls-internal-dir: {d} has no {wanted}")

    def env(self) -> dict[str, str]:
        return dict(zip(INTERNAL_ENVS, (self.ca, self.cert, self.key)))

    def _pems(self) -> tuple[bytes, bytes, bytes]:
        return (read_pem(self.ca, INTERNAL_CA_ENV), read_pem(self.cert, INTERNAL_CERT_ENV),
                read_pem(self.key, INTERNAL_KEY_ENV))

    def server_credentials(self) -> grpc.ServerCredentials:
        """Require a client certificate signed by the CA (no certificate: no handshake)."""
        ca, cert, key = self._pems()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Trust the CA, present our own certificate."""
        ca, cert, key = self._pems()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                            certificate_chain=cert)


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is loopback (``localhost``, 127/8, ::1)."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_bind(host: str, tls: bool, insecure: bool) -> None:
    """Plaintext on loopback only: a non-loopback ``host`` without TLS is refused unless
    ``insecure`` (issue 34)."""
    if not tls and not insecure and not is_loopback(host):
        raise ValueError(f"--host {host}: not a loopback address; serve it with TLS "
                         "(--tls-cert/--tls-key) or pass --insecure to serve plaintext")
