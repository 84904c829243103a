"""Access control on a live stack: API keys at the gateway, the internal token on the
schedulers, executors and perf-model, request ownership for Cancel, and Redis
messages from anyone who can publish."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import redis

from sloserve.client import AlreadyExists, Client, Unauthenticated
from sloserve.services.auth import load_api_keys
from sloserve.services.drills.redis_server import ThrowawayRedis
from sloserve.services.proto import (
    executor_grpc,
    executor_pb2,
    gateway_grpc,
    gateway_pb2,
    perfmodel_grpc,
    perfmodel_pb2,
    scheduler_grpc,
    scheduler_pb2,
)
from sloserve.services.stack import Stack

KEY_A, KEY_B = "key-a-0123456789", "key-b-9876543210"


@pytest.fixture
def keyed(start_stack: Callable[..., Stack], tmp_path: Path) -> Stack:
    keys = tmp_path / "keys"
    keys.write_text(f"# two tenants\n{KEY_A}\n\n{KEY_B}  # b\n")
    return start_stack(policy="sarathi", api_key_file=str(keys), time_scale=4.0)


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_gateway_refuses_calls_without_a_valid_key_and_serves_a_valid_one(keyed: Stack) -> None:
    with grpc.insecure_channel(keyed.gateway) as ch:
        gw = gateway_grpc.GatewayStub(ch)
        req = gateway_pb2.GenerateRequest(prompt="hi", max_tokens=2)
        for md in ((), (("authorization", "Bearer wrong"),), (("authorization", KEY_A),)):
            t0 = time.perf_counter()
            assert _code(lambda md=md: list(gw.Generate(req, metadata=md))) == \
                grpc.StatusCode.UNAUTHENTICATED
            assert time.perf_counter() - t0 < 1.0
            assert _code(lambda md=md: gw.Cancel(gateway_pb2.CancelRequest(request_id="x"),
                                                 metadata=md)) == grpc.StatusCode.UNAUTHENTICATED
            assert _code(lambda md=md: gw.Info(gateway_pb2.InfoRequest(), metadata=md)) == \
                grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(Unauthenticated):
        list(Client(keyed.gateway).generate("hi", max_tokens=2))
    chunks = list(Client(keyed.gateway, api_key=KEY_B).generate("hi", max_tokens=4))
    assert [c.index for c in chunks] == [0, 1, 2, 3]
    assert Client(keyed.gateway, api_key=KEY_A).info()["instances"]


def test_a_request_is_cancelled_only_by_the_key_that_created_it(keyed: Stack) -> None:
    got: list[int] = []
    started = threading.Event()

    def stream() -> None:
        for c in Client(keyed.gateway, api_key=KEY_A).generate(
                "hello", max_tokens=60, request_id="owned-by-a", ignore_eos=True):
            got.append(c.index)
            started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(30)
    assert Client(keyed.gateway, api_key=KEY_B).cancel("owned-by-a") is False
    t.join(60)
    assert got == list(range(60))  # B's cancel changed nothing
    # the owner can: a second request, cancelled by A
    errors: list[Exception] = []
    started.clear()

    def stream2() -> None:
        try:
            for _ in Client(keyed.gateway, api_key=KEY_A).generate(
                    "hello", max_tokens=400, request_id="owned-by-a-2", ignore_eos=True):
                started.set()
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    t = threading.Thread(target=stream2)
    t.start()
    assert started.wait(30)
    assert Client(keyed.gateway, api_key=KEY_A).cancel("owned-by-a-2") is True
    t.join(30)
    assert errors and type(errors[0]).__name__ == "Cancelled"


def test_two_keys_share_a_request_id_at_once_and_neither_touches_the_other(
        keyed: Stack) -> None:
    """Issue 33, 6: a client's request id lives in its key's namespace."""
    got: dict[str, list[str]] = {KEY_A: [], KEY_B: []}
    errors: dict[str, Exception] = {}
    live = {KEY_A: threading.Event(), KEY_B: threading.Event()}

    def stream(key: str, n: int) -> None:
        try:
            for c in Client(keyed.gateway, api_key=key).generate(
                    "hello", max_tokens=n, request_id="shared-id", ignore_eos=True):
                got[key].append(c.request_id)
                live[key].set()
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors[key] = exc

    ta = threading.Thread(target=stream, args=(KEY_A, 60))
    tb = threading.Thread(target=stream, args=(KEY_B, 400))
    ta.start()
    assert live[KEY_A].wait(30)
    tb.start()  # the same id, another key, while A's is live: served, not ALREADY_EXISTS
    assert live[KEY_B].wait(30)
    # within one key the id is still unique while live
    with pytest.raises(AlreadyExists):
        list(Client(keyed.gateway, api_key=KEY_B).generate(
            "hello", max_tokens=2, request_id="shared-id"))
    assert Client(keyed.gateway, api_key=KEY_B).cancel("shared-id") is True  # B's own only
    tb.join(30)
    ta.join(60)
    assert type(errors.get(KEY_B)).__name__ == "Cancelled"
    assert KEY_A not in errors and got[KEY_A] == ["shared-id"] * 60  # A's untouched, whole
    assert set(got[KEY_B]) == {"shared-id"}  # each sees its own id, never the scoped one
    assert Client(keyed.gateway, api_key=KEY_A).cancel("shared-id") is False  # A's is done


def test_a_rogue_process_cannot_drive_a_scheduler_executor_or_perf_model(keyed: Stack) -> None:
    sched = keyed.services["scheduler-lp0"].address
    execu = keyed.services["executor-lp0"].address
    pm = keyed.services["perfmodel"].address
    for md in ((), (("authorization", "Bearer not-the-token"),)):
        with grpc.insecure_channel(sched) as ch:
            stub = scheduler_grpc.SchedulerStub(ch)
            hello = scheduler_pb2.SchedulerInput(
                hello=scheduler_pb2.Hello(gateway_id="rogue"))
            outs: list[object] = []

            def connect(stub: scheduler_grpc.SchedulerStub = stub, md: object = md,
                        hello: object = hello, outs: list[object] = outs) -> None:
                for out in stub.Connect(iter([hello]), metadata=md, timeout=5):
                    outs.append(out)

            assert _code(connect) == grpc.StatusCode.UNAUTHENTICATED
            assert outs == []  # not one message: no other user's tokens
            assert _code(lambda stub=stub, md=md: stub.Status(
                scheduler_pb2.StatusRequest(), metadata=md)) == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(execu) as ch:
            ex = executor_grpc.ExecutorStub(ch)
            assert _code(lambda ex=ex, md=md: list(ex.Execute(
                iter([executor_pb2.BatchPlan()]), metadata=md, timeout=5))) == \
                grpc.StatusCode.UNAUTHENTICATED
            assert _code(lambda ex=ex, md=md: ex.Describe(
                executor_pb2.DescribeRequest(), metadata=md)) == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(pm) as ch:
            p = perfmodel_grpc.PerfModelStub(ch)
            assert _code(lambda p=p, md=md: p.GetCoefficients(
                perfmodel_pb2.CoefficientsRequest(), metadata=md)) == \
                grpc.StatusCode.UNAUTHENTICATED
    # the stack's own token works, and the stack still serves
    with grpc.insecure_channel(sched) as ch:
        st = scheduler_grpc.SchedulerStub(ch).Status(
            scheduler_pb2.StatusRequest(), metadata=keyed.internal_metadata)
    assert st.policy == "sarathi"
    assert len(list(Client(keyed.gateway, api_key=KEY_A).generate("x", max_tokens=3))) == 3
    assert keyed.exited() == []


def test_malformed_coefficients_and_samples_are_skipped_not_fatal(keyed: Stack) -> None:
    r = redis.Redis.from_url(keyed.redis_url)
    key = f"{keyed.prefix}:coefficients"
    for bad in (b"\xff not json", b"[1, 2]", json.dumps({"values": "x"}).encode(),
                json.dumps({"values": [1, 2, 3, 4, float("nan")], "version": 9,
                            "num_samples": 1, "fit_time": 0, "model": "m", "hardware": "h",
                            "mape": 0}).encode()):
        r.publish(key, bad)
    r.xadd(f"{keyed.prefix}:samples", {"p": "garbage", "t": "-1"})
    r.xadd(f"{keyed.prefix}:samples", {"x": "1"})
    r.close()
    logs = keyed.cfg.log_dir
    assert logs is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "coefficients_malformed" not in (
            logs / "scheduler-lp0.log").read_text():
        time.sleep(0.1)
    time.sleep(4.0)  # a process that were to die of it would be gone by now (2 s grace)
    assert keyed.exited() == []
    chunks = Client(keyed.gateway, api_key=KEY_A).generate("x", max_tokens=3, timeout=20)
    assert len(list(chunks)) == 3
    assert "coefficients_malformed" in (logs / "scheduler-lp0.log").read_text()
    assert "sample_malformed" in (logs / "perfmodel.log").read_text()


def test_keys_come_from_env_and_file_and_there_is_no_default(tmp_path: Path) -> None:
    assert load_api_keys(None, env="") == frozenset()  # auth off: no key accepted by default
    f = tmp_path / "k"
    f.write_text("# c\nfile-key\n")
    assert load_api_keys(str(f), env="a, b c") == {"a", "b", "c", "file-key"}
    with pytest.raises(ValueError, match="--api-key-file"):
        load_api_keys(str(tmp_path / "missing"), env="")


def test_a_password_protected_redis_is_used_and_the_password_stays_off_command_lines(
    start_stack: Callable[..., Stack],
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    secret = "pw-" + "x7" * 12
    server = ThrowawayRedis(password=secret)
    server.start()
    try:
        stack = start_stack(policy="sarathi", redis_url=server.url)
        chunks = list(Client(stack.gateway).generate("hi", max_tokens=4, timeout=30))
        assert len(chunks) == 4
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()  # no password: refused
        authed = redis.Redis.from_url(server.url)
        assert authed.exists(f"{stack.prefix}:coefficients")  # the perf model wrote its fit
        authed.close()
        for svc in stack.services.values():
            assert svc.proc is not None
            cmdline = Path(f"/proc/{svc.proc.pid}/cmdline").read_bytes()
            assert secret.encode() not in cmdline, svc.name
        assert stack.exited() == []
    finally:
        server.kill()


def test_internal_services_bind_loopback_whatever_the_gateway_host(tmp_path: Path) -> None:
    from sloserve.services.stack import StackConfig

    stack = Stack(StackConfig(host="0.0.0.0", redis_url="redis://127.0.0.1:1/0",
                              log_dir=tmp_path, instances=2))
    stack.plan()
    hosts = {n: s.argv[s.argv.index("--host") + 1] for n, s in stack.services.items()}
    assert hosts.pop("gateway") == "0.0.0.0"
    assert set(hosts.values()) == {"127.0.0.1"}, hosts
    assert all(s.address.startswith("127.0.0.1:") for n, s in stack.services.items()
               if n != "gateway")
    assert stack.internal_token and len(stack.internal_token) >= 32  # generated per stack
    assert Stack(StackConfig(redis_url="redis://x/0")).internal_token != stack.internal_token
