"""Transport security on a live stack (issue 34, item 1): TLS on the gateway's gRPC and
HTTPS ports, the SDK trusting a CA, mutual TLS with a certificate per service on the
internal plane, Redis over ``rediss://``, and plaintext on loopback only.

Every certificate is made here by ``trustme``; one stack carries all of it (the machine
is small), each test checks one hop."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import redis
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sloserve.client import AsyncClient, Client, Unavailable
from sloserve.services import cli
from sloserve.services.proto import (
    executor_grpc,
    executor_pb2,
    perfmodel_grpc,
    perfmodel_pb2,
    scheduler_grpc,
    scheduler_pb2,
)
from sloserve.services.redisconn import connect
from sloserve.services.stack import Stack, StackConfig
from sloserve.services.store import free_port
from sloserve.services.tls import TLS_CA_ENV, MutualTLS, ServerTLS, check_bind, is_loopback

LOOPBACK = ("127.0.0.1", "localhost")
KINDS = ("gateway", "scheduler", "executor", "perfmodel")


def _issue(ca: trustme.CA, d: Path, name: str) -> None:
    cert = ca.issue_cert(*LOOPBACK, common_name=name)
    cert.cert_chain_pems[0].write_to_path(str(d / f"{name}.pem"))
    cert.private_key_pem.write_to_path(str(d / f"{name}-key.pem"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``public/``: the gateway's CA, cert and key; ``internal/``: the internal plane's CA
    and one certificate per service kind; ``rogue/``: a certificate from another CA."""
    root = tmp_path_factory.mktemp("pki")
    for sub, kinds in (("public", ("gateway",)), ("internal", KINDS), ("rogue", ("rogue",)),
                       ("redis", ("redis",))):
        d = root / sub
        d.mkdir()
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(d / "ca.pem"))
        for k in kinds:
            _issue(ca, d, k)
    return root


@pytest.fixture(scope="module")
def tls_redis(pki: Path) -> Iterator[str]:
    """A real Redis serving TLS only (``--port 0``); its ``rediss://`` URL."""
    d, port = pki / "redis", free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--save", "",
         "--appendonly", "no", "--tls-cert-file", str(d / "redis.pem"),
         "--tls-key-file", str(d / "redis-key.pem"), "--tls-ca-cert-file", str(d / "ca.pem"),
         "--tls-auth-clients", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={d / 'ca.pem'}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def secure(pki: Path, tls_redis: str, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Stack]:
    """A stack with every hop encrypted: TLS gateway (gRPC + HTTPS), mutual TLS inside,
    Redis over rediss://."""
    pub = pki / "public"
    stack = Stack(StackConfig(
        policy="sarathi", instances=2, gateway_port=free_port(),
        http_port=free_port(), redis_url=tls_redis, refit_interval=0.5,
        log_dir=tmp_path_factory.mktemp("logs"),
        tls_cert=str(pub / "gateway.pem"), tls_key=str(pub / "gateway-key.pem"),
        tls_ca=str(pub / "ca.pem"), tls_internal_dir=str(pki / "internal")))
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def test_sdk_with_the_ca_streams_50_requests_and_a_plaintext_client_is_refused(
        secure: Stack, pki: Path) -> None:
    ca = str(pki / "public" / "ca.pem")
    with Client(secure.gateway, tls_ca=ca) as client:
        done = [len(list(client.generate("hi", max_tokens=8, ignore_eos=True)))
                for _ in range(50)]
    assert done == [8] * 50

    async def async_stream() -> int:
        client = AsyncClient(secure.gateway, tls_ca=ca)
        return len([c async for c in client.generate("hi", max_tokens=5, ignore_eos=True)])

    assert asyncio.run(async_stream()) == 5
    with pytest.raises(Unavailable), Client(secure.gateway) as plain:  # no CA: plaintext
        list(plain.generate("hi", max_tokens=2))
    with pytest.raises(Unavailable), Client(secure.gateway,  # a CA that did not sign it
                                            tls_ca=str(pki / "rogue" / "ca.pem")) as wrong:
        list(wrong.generate("hi", max_tokens=2))


def test_sdk_reads_the_ca_from_the_environment(secure: Stack, pki: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TLS_CA_ENV, str(pki / "public" / "ca.pem"))
    with Client(secure.gateway) as client:
        assert len(list(client.generate("hi", max_tokens=3, ignore_eos=True))) == 3


def test_curl_with_the_ca_gets_models_over_https_and_plain_http_is_refused(
        secure: Stack, pki: Path) -> None:
    assert secure.http.startswith("https://")
    got = subprocess.run(["curl", "-sS", "--max-time", "10", "--cacert",
                          str(pki / "public" / "ca.pem"), f"{secure.http}/v1/models"],
                         capture_output=True, text=True, timeout=20)
    assert got.returncode == 0, got.stderr
    assert '"object":"list"' in got.stdout.replace(" ", "")
    unverified = subprocess.run(["curl", "-sS", "--max-time", "10", f"{secure.http}/v1/models"],
                                capture_output=True, text=True, timeout=20)
    assert unverified.returncode != 0  # no CA: the certificate is not trusted
    plain = subprocess.run(["curl", "-sS", "--max-time", "10",
                            secure.http.replace("https://", "http://") + "/v1/models"],
                           capture_output=True, text=True, timeout=20)
    assert '"object"' not in plain.stdout


def _refused(address: str, creds: grpc.ChannelCredentials | None,
             md: tuple[tuple[str, str], ...]) -> list[grpc.StatusCode]:
    """Each internal call's status from a client holding ``creds`` (None: plaintext)."""
    ch = grpc.insecure_channel(address) if creds is None else \
        grpc.secure_channel(address, creds)
    codes = []
    with ch:
        calls: list[Callable[[], object]] = [
            lambda: health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=3),
            lambda: scheduler_grpc.SchedulerStub(ch).Status(
                scheduler_pb2.StatusRequest(), metadata=md, timeout=3),
            lambda: executor_grpc.ExecutorStub(ch).Describe(
                executor_pb2.DescribeRequest(), metadata=md, timeout=3),
            lambda: perfmodel_grpc.PerfModelStub(ch).GetCoefficients(
                perfmodel_pb2.CoefficientsRequest(), metadata=md, timeout=3)]
        for call in calls:
            try:
                call()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
    return codes


def test_internal_services_answer_no_client_without_a_valid_certificate(
        secure: Stack, pki: Path) -> None:
    internal = pki / "internal"
    ca = (internal / "ca.pem").read_bytes()
    rogue = pki / "rogue"
    clients = {
        "plaintext": None,
        "server-auth only (no client cert)": grpc.ssl_channel_credentials(ca),
        "cert from another CA": grpc.ssl_channel_credentials(
            ca, (rogue / "rogue-key.pem").read_bytes(), (rogue / "rogue.pem").read_bytes()),
    }
    names = [n for n in secure.services if n != "gateway"]
    assert {n.split("-")[0] for n in names} == {"scheduler", "executor", "perfmodel"}
    for name in names:
        address = secure.services[name].address
        for who, creds in clients.items():
            # even with the internal token: the handshake fails before any message
            codes = _refused(address, creds, secure.internal_metadata)
            assert set(codes) == {grpc.StatusCode.UNAVAILABLE}, (name, who, codes)
    # control: a certificate from the internal CA (and the token) is answered
    good = MutualTLS.from_dir(internal, "gateway").channel_credentials()
    sched = next(n for n in names if n.startswith("scheduler"))
    with grpc.secure_channel(secure.services[sched].address, good) as ch:
        scheduler_grpc.SchedulerStub(ch).Status(scheduler_pb2.StatusRequest(),
                                                metadata=secure.internal_metadata, timeout=5)
        with pytest.raises(grpc.RpcError) as no_token:  # the token stays a second factor
            scheduler_grpc.SchedulerStub(ch).Status(scheduler_pb2.StatusRequest(), timeout=5)
    assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert secure.exited() == []


def test_redis_over_rediss_carries_the_stack_state(secure: Stack, tls_redis: str) -> None:
    r = redis.Redis.from_url(tls_redis)
    assert any(True for _ in r.scan_iter(f"{secure.prefix}:*", count=1000))
    plain = redis.Redis.from_url(tls_redis.replace("rediss://", "redis://").split("?")[0],
                                 socket_connect_timeout=2, socket_timeout=2)
    with pytest.raises(redis.RedisError):
        plain.ping()

    async def ping() -> bool:
        client = connect(tls_redis)
        try:
            return bool(await client.ping())
        finally:
            await client.aclose()

    assert asyncio.run(ping())


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_up_refuses_a_non_loopback_host_without_tls_naming_the_flags(
        host: str, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    assert cli.main(["up", "--host", host, "--redis-url", "redis://127.0.0.1:1/0"]) == 2
    err = capsys.readouterr().err
    assert f"--host {host}" in err and "--tls-cert/--tls-key" in err and "--insecure" in err
    assert time.monotonic() - t0 < 5  # nothing was started


def test_plaintext_is_allowed_on_loopback_and_with_insecure_or_tls() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.8.9.10"):
        assert is_loopback(host)
        check_bind(host, tls=False, insecure=False)
    assert not is_loopback("0.0.0.0")
    check_bind("0.0.0.0", tls=False, insecure=True)
    check_bind("0.0.0.0", tls=True, insecure=False)


def test_bad_tls_flags_are_one_error_naming_the_flag(tmp_path: Path, pki: Path) -> None:
    pub = pki / "public"
    with pytest.raises(ValueError, match="--tls-key: required with --tls-cert"):
        ServerTLS.from_args(str(pub / "gateway.pem"), None)
    with pytest.raises(ValueError, match="--tls-cert: required with --tls-key"):
        ServerTLS.from_args(None, str(pub / "gateway-key.pem"))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="--tls-cert: .*junk.pem is not a PEM file"):
        ServerTLS.from_args(str(junk), str(pub / "gateway-key.pem"))
    with pytest.raises(ValueError, match="--tls-key: cannot read"):
        ServerTLS.from_args(str(pub / "gateway.pem"), str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="--tls-internal-dir: .*ca.pem is missing"):
        MutualTLS.from_dir(tmp_path, "gateway")
    with pytest.raises(ValueError, match="--tls-ca: required with --tls-cert"):
        StackConfig(tls_cert=str(pub / "gateway.pem"),
                    tls_key=str(pub / "gateway-key.pem")).validate()


def test_each_service_gets_its_own_certificate_else_its_kinds(pki: Path, tmp_path: Path) -> None:
    internal = pki / "internal"
    d = tmp_path / "internal"
    d.mkdir()
    for f in internal.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    ca = trustme.CA()  # its own certificate for one scheduler (any CA: files only here)
    _issue(ca, d, "scheduler-lp0")
    stack = Stack(StackConfig(instances=2, redis_url="redis://127.0.0.1:1/0",
                              tls_internal_dir=str(d)))
    stack.plan()
    own, kind = stack.internal_tls("scheduler-lp0"), stack.internal_tls("scheduler-lp1")
    assert own is not None and own.cert == str(d / "scheduler-lp0.pem")
    assert kind is not None and kind.cert == str(d / "scheduler.pem")
    assert {n: Path(t.key).name for n in stack.services
            if (t := stack.internal_tls(n)) is not None} == {
        "perfmodel": "perfmodel-key.pem", "executor-lp0": "executor-key.pem",
        "executor-lp1": "executor-key.pem", "scheduler-lp0": "scheduler-lp0-key.pem",
        "scheduler-lp1": "scheduler-key.pem", "gateway": "gateway-key.pem"}
    (d / "executor.pem").unlink()
    with pytest.raises(ValueError, match="--tls-internal-dir: .* has no executor-lp0.pem"):
        stack.internal_tls("executor-lp0")
    assert Stack(StackConfig(redis_url="redis://127.0.0.1:1/0")).internal_tls("gateway") is None


def test_up_flags_reach_the_gateway_and_the_children(pki: Path, tmp_path: Path) -> None:
    from sloserve.services.cli import build_parser
    from sloserve.services.up_cmd import config_from_args

    pub, internal = pki / "public", pki / "internal"
    args = build_parser().parse_args([
        "up", "--host", "0.0.0.0", "--redis-url", "redis://127.0.0.1:1/0",
        "--log-dir", str(tmp_path), "--tls-cert", str(pub / "gateway.pem"),
        "--tls-key", str(pub / "gateway-key.pem"), "--tls-ca", str(pub / "ca.pem"),
        "--tls-internal-dir", str(internal)])
    stack = Stack(config_from_args(args))
    stack.plan()
    gw = stack.services["gateway"].argv
    assert gw[gw.index("--tls-cert") + 1] == str(pub / "gateway.pem")
    assert gw[gw.index("--tls-key") + 1] == str(pub / "gateway-key.pem")
    assert all("--tls-cert" not in s.argv for n, s in stack.services.items() if n != "gateway")
    assert stack.credentials("gateway") is not None and stack.credentials("perfmodel")
    tls = stack.internal_tls("executor-lp0")
    assert tls is not None and tls.env()["SLOSERVE_INTERNAL_KEY"] == \
        str(internal / "executor-key.pem")
