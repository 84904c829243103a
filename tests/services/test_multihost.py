"""Multi-host on one machine (issue 34, items 2 and 5): every service in its own network
namespace (``ip netns``, veth pairs to a bridge, one address each), TLS on every hop
(the gateway's public port, mutual TLS on the internal plane, ``rediss://`` to a Redis
bound on the bridge), the gateway learning instances from the registry in Redis.

Namespaces: ``gw`` (gateway + perf-model), ``a`` and ``b`` (an instance each: executor +
scheduler), ``late`` (an instance started while the stack serves: it joins, takes work,
and on SIGTERM deregisters and drains, its requests re-running on ``a`` and ``b``).
Skipped, with the reason, where namespaces cannot be made (not root, no ``ip``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import trustme

from sloserve.client import Client
from sloserve.services import cli, rpc
from sloserve.services.auth import INTERNAL_TOKEN_ENV, new_token
from sloserve.services.drills.faults import wait_event
from sloserve.services.drills.streams import start_streams
from sloserve.services.proto import SERVICE_NAMES
from sloserve.services.rpc import PARENT_PID_ENV
from sloserve.services.tls import TLS_CA_ENV, MutualTLS, client_credentials

pytestmark = pytest.mark.slow

NAMESPACES = ("gw", "a", "b", "late")
EXECUTOR_PORT, SCHEDULER_PORT, GATEWAY_PORT, PERFMODEL_PORT = 24100, 24101, 24102, 24103
REDIS_PORT = 24104
TTL_S = 3.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Net:
    """A bridge with one namespace per ``NAMESPACES`` entry, each with its own address."""

    tag: str
    subnet: str
    addrs: dict[str, str] = field(default_factory=dict)  # namespace -> its address
    rule: list[str] = field(default_factory=list)  # our iptables FORWARD rule, if added

    @property
    def bridge(self) -> str:
        return f"slr{self.tag}br"

    @property
    def bridge_ip(self) -> str:
        return f"{self.subnet}.1"

    def ns(self, name: str) -> str:
        return f"slr{self.tag}{name}"

    def up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for k, name in enumerate(NAMESPACES):
            ns, host, peer = self.ns(name), f"slr{self.tag}v{k}", f"slr{self.tag}p{k}"
            _ip("netns", "add", ns)
            _ip("link", "add", host, "type", "veth", "peer", "name", peer)
            _ip("link", "set", host, "master", self.bridge)
            _ip("link", "set", host, "up")
            _ip("link", "set", peer, "netns", ns)
            addr = f"{self.subnet}.{10 + k}"
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", peer)
            _ip("-n", ns, "link", "set", peer, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self.addrs[name] = addr
        # a host firewall that drops forwarded frames (Docker's FORWARD DROP with
        # br_netfilter) would cut namespace-to-namespace traffic: let our bridge's through
        if shutil.which("iptables"):
            self.rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
            subprocess.run(["iptables", "-I", *self.rule], check=True, capture_output=True)

    def down(self) -> None:
        """Undo whatever ``up`` got to (each step on its own: a failure leaves no debris)."""
        if self.rule:
            subprocess.run(["iptables", "-D", *self.rule], capture_output=True)
        for k, name in enumerate(NAMESPACES):
            subprocess.run(["ip", "netns", "del", self.ns(name)], capture_output=True)
            subprocess.run(["ip", "link", "del", f"slr{self.tag}v{k}"], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("ip netns needs root (CAP_NET_ADMIN)")
    if shutil.which("ip") is None or shutil.which("redis-server") is None:
        pytest.skip("needs iproute2's ip and redis-server")
    pid = os.getpid()
    n = Net(tag=f"{pid % 10000:04d}", subnet=f"10.241.{pid % 250}")
    try:
        n.up()
    except subprocess.CalledProcessError as exc:
        n.down()
        pytest.skip(
            f"ip netns is unavailable here: {' '.join(exc.cmd)}: {(exc.stderr or '').strip()}"
        )
    try:
        yield n
    finally:
        n.down()


@dataclass
class Pki:
    root: Path

    def internal(self, kind: str) -> MutualTLS:
        d = self.root / "internal"
        return MutualTLS(str(d / "ca.pem"), str(d / f"{kind}.pem"), str(d / f"{kind}-key.pem"))

    @property
    def public_ca(self) -> str:
        return str(self.root / "public" / "ca.pem")


@pytest.fixture(scope="module")
def pki(net: Net, tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """trustme certificates naming the namespaces' addresses: the gateway's public one,
    one per internal kind (and ``client``: the test's own), Redis's on the bridge."""
    root = tmp_path_factory.mktemp("pki")
    sans = [*net.addrs.values(), net.bridge_ip]
    for sub, kinds in (
        ("public", ("gateway",)),
        ("redis", ("redis",)),
        ("internal", ("gateway", "scheduler", "executor", "perfmodel", "client")),
    ):
        d = root / sub
        d.mkdir()
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(d / "ca.pem"))
        for kind in kinds:
            cert = ca.issue_cert(*sans, common_name=kind)
            cert.cert_chain_pems[0].write_to_path(str(d / f"{kind}.pem"))
            cert.private_key_pem.write_to_path(str(d / f"{kind}-key.pem"))
    return Pki(root)


@dataclass
class Deployment:
    net: Net
    pki: Pki
    logs: Path
    redis_url: str
    prefix: str
    token: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def gateway(self) -> str:
        return f"{self.net.addrs['gw']}:{GATEWAY_PORT}"

    def spawn(self, name: str, ns: str, svc: str, port: int, *args: str) -> None:
        """``python -m sloserve.services.<svc>`` inside namespace ``ns`` on its address."""
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "REDIS_URL": self.redis_url,
            PARENT_PID_ENV: str(os.getpid()),
            INTERNAL_TOKEN_ENV: self.token,
            **self.pki.internal(svc).env(),
        }
        argv = [
            "ip",
            "netns",
            "exec",
            self.net.ns(ns),
            sys.executable,
            "-m",
            f"sloserve.services.{svc}",
            "--host",
            self.net.addrs[ns],
            "--port",
            str(port),
            "--prefix",
            self.prefix,
            "--registry-ttl",
            str(TTL_S),
            *args,
        ]
        with open(self.logs / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log, env=env)

    def instance(self, ns: str, iid: str, k: int) -> None:
        """An executor and its scheduler in ``ns`` (instance ``iid``)."""
        addr = self.net.addrs[ns]
        self.spawn(
            f"executor-{iid}",
            ns,
            "executor",
            EXECUTOR_PORT,
            "--backend",
            "sim",
            "--instance",
            str(k),
        )
        self.spawn(
            f"scheduler-{iid}",
            ns,
            "scheduler",
            SCHEDULER_PORT,
            "--instance-id",
            iid,
            "--role",
            "lp",
            "--executor",
            f"{addr}:{EXECUTOR_PORT}",
            "--drain-timeout",
            "30",
        )

    def healthy(self, address: str, service: str, timeout: float = 90.0) -> None:
        creds = (
            client_credentials(self.pki.public_ca)
            if service == "gateway"
            else self.pki.internal("client").channel_credentials()
        )
        rpc.wait_healthy(address, SERVICE_NAMES[service], timeout, creds)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def deployment(
    net: Net,
    pki: Pki,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    """Redis (TLS only, bound on the bridge), then perf-model + gateway in ``gw`` and one
    instance in each of ``a`` and ``b``; torn down (processes, Redis) even on failure."""
    logs = tmp_path_factory.mktemp("logs")
    d, password = pki.root / "redis", new_token()  # off loopback: protected by a password
    server = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            net.bridge_ip,
            "--port",
            "0",
            "--tls-port",
            str(REDIS_PORT),
            "--save",
            "",
            "--appendonly",
            "no",
            "--tls-cert-file",
            str(d / "redis.pem"),
            "--tls-key-file",
            str(d / "redis-key.pem"),
            "--tls-ca-cert-file",
            str(d / "ca.pem"),
            "--tls-auth-clients",
            "no",
            "--requirepass",
            password,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"rediss://:{password}@{net.bridge_ip}:{REDIS_PORT}/0?ssl_ca_certs={d / 'ca.pem'}"
    dep = Deployment(net, pki, logs, url, f"sloserve-mh:{uuid.uuid4().hex[:8]}", new_token())
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        dep.spawn("perfmodel", "gw", "perfmodel", PERFMODEL_PORT)
        dep.instance("a", "lp0", 0)
        dep.instance("b", "lp1", 1)
        dep.spawn(
            "gateway",
            "gw",
            "gateway",
            GATEWAY_PORT,
            "--min-instances",
            "2",
            "--registry-poll",
            "0.2",
            "--connect-timeout",
            "90",
            "--tls-cert",
            str(pki.root / "public" / "gateway.pem"),
            "--tls-key",
            str(pki.root / "public" / "gateway-key.pem"),
        )
        dep.healthy(dep.gateway, "gateway")
        yield dep
    finally:
        dep.stop()
        server.kill()
        server.wait()


def events(log: Path, name: str) -> list[dict[str, object]]:
    """The JSON log lines of ``log`` whose event is ``name``."""
    lines = (json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{"))
    return [e for e in lines if e.get("event") == name]


def test_a_100_request_bench_through_three_namespaces_completes_over_tls(
    deployment: Deployment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dep = deployment
    with pytest.raises(TimeoutError):  # plaintext to the gateway gets no answer
        rpc.wait_healthy(dep.gateway, SERVICE_NAMES["gateway"], 1.0)
    info = Client(dep.gateway, tls_ca=dep.pki.public_ca).info()
    assert {(i["instance_id"], i["address"]) for i in info["instances"]} == {
        ("lp0", f"{dep.net.addrs['a']}:{SCHEDULER_PORT}"),
        ("lp1", f"{dep.net.addrs['b']}:{SCHEDULER_PORT}"),
    }  # as advertised, from the registry
    trace = tmp_path / "short.csv"
    trace.write_text(
        "prompt_len,output_len\n" + "".join(f"{32 + 8 * (k % 8)},{8 + k % 9}\n" for k in range(100))
    )
    monkeypatch.setenv(TLS_CA_ENV, dep.pki.public_ca)
    t0 = time.monotonic()
    code = cli.main(
        [
            "bench",
            "--target",
            dep.gateway,
            "--trace-file",
            str(trace),
            "--sample",
            "ordered",
            "--qps",
            "25",
            "--num-requests",
            "100",
            "--json",
            "--disable-tqdm",
        ]
    )
    wall = time.monotonic() - t0
    assert code == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    print(
        f"\nmultihost bench: {out['completed']}/100 completed, {out['failed']} failed, "
        f"wall {wall:.1f} s, load {os.getloadavg()[0]:.2f}"
    )
    assert out["completed"] == 100 and out["failed"] == 0 and out["instances"] == 2


def test_an_instance_started_later_joins_takes_work_and_on_stop_drains_elsewhere(
    deployment: Deployment,
) -> None:
    dep = deployment
    gw_log = dep.logs / "gateway.log"
    client = Client(dep.gateway, tls_ca=dep.pki.public_ca)
    t_start = time.time()
    dep.instance("late", "lp2", 2)
    joined = wait_event(gw_log, "instance_joined", 0, 90)
    join_s = time.time() - t_start
    assert joined["instance"] == "lp2"
    assert joined["address"] == f"{dep.net.addrs['late']}:{SCHEDULER_PORT}"
    where = [
        list(client.generate(prompt_token_ids=[70] * 16, max_tokens=2))[-1].instance_id
        for _ in range(6)
    ]
    assert where.count("lp2") == 2, where  # round-robin over three LP instances

    streams = start_streams(client, 9, 300, "leave")  # each has its first token
    sched = dep.procs["scheduler-lp2"]
    t_stop = time.time()
    sched.send_signal(signal.SIGTERM)
    left = wait_event(gw_log, "instance_left", 0, 30)
    code = sched.wait(timeout=40)
    exit_s = time.time() - t_stop
    streams.join(120)
    assert not streams.errors, streams.errors
    assert left["instance"] == "lp2" and left["reason"] == "deregistered"
    # draining turns its readiness off: the health watch's instance-lost usually re-runs
    # the requests before the registry's leave is read (which then forgets the instance)
    lost = [e for e in events(gw_log, "instance_lost") if e["instance"] == "lp2"]
    rerun = int(left["rerun"]) + sum(int(e["rerun"]) for e in lost)  # type: ignore[call-overload]
    on_lp2 = [k for k, chunks in streams.results.items() if chunks[0].instance_id == "lp2"]
    assert len(on_lp2) == 3 and rerun >= 1 and left["dropped"] == 0
    for k, chunks in streams.results.items():  # every stream whole, in order, exactly once
        assert [c.index for c in chunks] == list(range(300)), k
    moved = [k for k in on_lp2 if streams.results[k][-1].instance_id != "lp2"]
    assert len(moved) == rerun
    drained = wait_event(dep.logs / "scheduler-lp2.log", "drained", 0, 5)
    assert code == 0 and drained["left"] == 0
    assert {i["instance_id"] for i in client.info()["instances"]} == {"lp0", "lp1"}
    leave_s = float(left["at"]) - t_stop  # type: ignore[arg-type]
    print(
        f"\nmultihost join/leave: joined {join_s:.1f} s after its processes started; "
        f"{rerun} of {len(on_lp2)} streams on lp2 re-run elsewhere (instance_lost "
        f"{len(lost)}, instance_left {left['rerun']}), the gateway's "
        f"instance_left {leave_s:.2f} s and the scheduler's exit {exit_s:.2f} s after "
        f"SIGTERM; 9/9 streams whole; load {os.getloadavg()[0]:.2f}"
    )
    dep.procs["executor-lp2"].send_signal(signal.SIGTERM)
