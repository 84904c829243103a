"""``sloserve up``'s supervisor: a killed or hung service is restarted alone, in
parallel with others, and ``up`` keeps running until it is asked to stop."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sloserve.client import Client
from sloserve.services.store import free_port

SERVICES = ("perfmodel", "executor", "scheduler", "gateway")
N_STREAMS, STREAM_TOKENS = 8, 150


class Up:
    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sloserve.services.cli", "up", "--port", str(self.port),
             "--log-dir", str(tmp_path), *extra],
            stdout=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if "gateway ready" in line:
                self.ready.set()

    def pids(self) -> dict[str, int]:
        """Each service's PID, by its module name."""
        out: dict[str, int] = {}
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:  # threads come and go
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for c in kids:
                try:
                    cmd = Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")
                    state = Path(f"/proc/{c}/stat").read_text().split()[2]
                except OSError:
                    continue
                mod = next((a.decode() for a in cmd if a.startswith(b"sloserve.services.")), "")
                if state != "Z":
                    out[mod.rsplit(".", 1)[-1]] = int(c)
        return out

    def serving_again(self, name: str, after: int = 0) -> float | None:
        """Seconds the supervisor reported for ``name``'s recovery (its ``after``-th)."""
        found = [float(m.group(1)) for ln in self.lines
                 if (m := re.search(rf"{name}\S* SERVING again .* ([0-9.]+) s after", ln))]
        return found[after] if len(found) > after else None


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    u = Up(tmp_path, "--unhealthy-after", "3")
    assert u.ready.wait(90), u.lines
    yield u
    if u.proc.poll() is None:
        u.proc.send_signal(signal.SIGTERM)
        try:
            u.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            u.proc.kill()


def _served(port: int, until: float) -> float:
    """Time at which a request first completes (retrying until ``until``)."""
    while time.monotonic() < until:
        try:
            chunks = list(Client(f"127.0.0.1:{port}").generate("hi", max_tokens=3, timeout=5))
            if len(chunks) == 3:
                return time.monotonic()
        except Exception:  # noqa: BLE001 - the stack is recovering
            time.sleep(0.1)
    raise AssertionError("not served again in time")


def _wait_for(cond: object, timeout: float, why: object = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(cond) and cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out: {why}")


def test_killed_services_are_restarted_in_parallel_and_the_rest_keep_their_pids(up: Up) -> None:
    before = up.pids()
    assert set(before) == set(SERVICES), before
    t0 = time.monotonic()
    for name in ("perfmodel", "gateway"):  # two at once: neither waits for the other
        os.kill(before[name], signal.SIGKILL)
    served = _served(up.port, t0 + 60)
    _wait_for(lambda: up.serving_again("perfmodel") is not None
              and up.serving_again("gateway") is not None, 30, up.lines)
    after = up.pids()
    assert after["perfmodel"] != before["perfmodel"] and after["gateway"] != before["gateway"]
    assert after["scheduler"] == before["scheduler"]
    assert after["executor"] == before["executor"]
    assert up.proc.poll() is None  # up still runs
    print(f"\nrecovered: perfmodel {up.serving_again('perfmodel'):.2f} s, gateway "
          f"{up.serving_again('gateway'):.2f} s after detection; first request served "
          f"{served - t0:.2f} s after the kill")
    # the executor: its scheduler ends its stream with it (and is restarted as well);
    # the gateway and perf model are untouched
    mid = up.pids()
    streams: dict[int, list[int]] = {}
    failed: list[BaseException] = []
    first = threading.Barrier(N_STREAMS + 1)

    def stream(k: int) -> None:
        got = streams.setdefault(k, [])
        try:
            for c in Client(f"127.0.0.1:{up.port}").generate(
                    "hello", max_tokens=STREAM_TOKENS, ignore_eos=True, timeout=90):
                got.append(c.index)
                if len(got) == 1:
                    first.wait(30)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            failed.append(exc)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(N_STREAMS)]
    for t in threads:
        t.start()
    first.wait(30)  # every stream has its first token: all in flight
    t1 = time.monotonic()
    os.kill(mid["executor"], signal.SIGKILL)
    _wait_for(lambda: up.serving_again("executor") is not None, 30, up.lines)
    served = _served(up.port, t1 + 60)
    for t in threads:
        t.join(90)
    lost = [k for k, got in streams.items() if got != list(range(STREAM_TOKENS))]
    assert not failed and not lost, (failed, lost)
    last = up.pids()
    assert last["executor"] != mid["executor"]
    assert (last["gateway"], last["perfmodel"]) == (mid["gateway"], mid["perfmodel"])
    print(f"executor SERVING {up.serving_again('executor'):.2f} s after detection; first "
          f"new request served {served - t1:.2f} s after the kill; {N_STREAMS}/{N_STREAMS} "
          f"in-flight streams complete, 0 lost")
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(timeout=20) == 0


def test_a_hung_service_is_killed_and_restarted_after_the_unhealthy_window(up: Up) -> None:
    before = up.pids()
    t0 = time.monotonic()
    os.kill(before["scheduler"], signal.SIGSTOP)  # alive, but answers nothing
    _wait_for(lambda: up.serving_again("scheduler") is not None, 60, up.lines)
    detected = time.monotonic() - t0
    after = up.pids()
    assert after["scheduler"] != before["scheduler"]
    assert {k: v for k, v in after.items() if k != "scheduler"} == \
        {k: v for k, v in before.items() if k != "scheduler"}
    assert any(re.search(r"scheduler\S* unhealthy for", ln) for ln in up.lines), up.lines
    served = _served(up.port, time.monotonic() + 60)
    assert up.proc.poll() is None
    print(f"\nhung scheduler replaced and SERVING {detected:.2f} s after SIGSTOP "
          f"(unhealthy window 3 s); served again {served - t0:.2f} s after SIGSTOP")


def test_a_hung_executor_is_replaced_and_its_healthy_scheduler_keeps_running(up: Up) -> None:
    """Issue 36, item 4: the scheduler turns NOT_SERVING (readiness) when its executor
    hangs under load, but stays alive; the supervisor replaces the executor only, and
    the streams in flight complete exactly."""
    before = up.pids()
    streams: dict[int, list[int]] = {}
    failed: list[BaseException] = []
    first = threading.Barrier(N_STREAMS + 1)

    def stream(k: int) -> None:
        got = streams.setdefault(k, [])
        try:
            for c in Client(f"127.0.0.1:{up.port}").generate(
                    "hello", max_tokens=STREAM_TOKENS, ignore_eos=True, timeout=90):
                got.append(c.index)
                if len(got) == 1:
                    first.wait(30)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            failed.append(exc)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(N_STREAMS)]
    for t in threads:
        t.start()
    first.wait(30)  # every stream has its first token: the scheduler is mid-batch
    t0 = time.monotonic()
    os.kill(before["executor"], signal.SIGSTOP)
    try:
        _wait_for(lambda: up.serving_again("executor") is not None, 60, up.lines)
        replaced = time.monotonic() - t0
        for t in threads:
            t.join(90)
        served = _served(up.port, time.monotonic() + 60) - t0
        time.sleep(4.0)  # past another unhealthy window: the scheduler is still not restarted
    finally:
        with contextlib.suppress(ProcessLookupError):  # SIGKILLed and reaped: gone
            os.kill(before["executor"], signal.SIGCONT)
    lost = [k for k, got in streams.items() if got != list(range(STREAM_TOKENS))]
    assert not failed and not lost, (failed, lost)
    after = up.pids()
    assert after["executor"] != before["executor"]
    assert not any(re.search(r"supervisor: scheduler", ln) for ln in up.lines), up.lines
    assert {k: v for k, v in after.items() if k != "executor"} == \
        {k: v for k, v in before.items() if k != "executor"}, (before, after, up.lines)
    assert up.proc.poll() is None
    print(f"\nhung executor replaced and SERVING {replaced:.2f} s after SIGSTOP "
          f"(unhealthy window 3 s); {N_STREAMS}/{N_STREAMS} streams exact; served again "
          f"{served:.2f} s after SIGSTOP; scheduler pid unchanged")


def test_up_prints_one_auth_line(up: Up) -> None:
    auth = [ln for ln in up.lines if ln.startswith("auth")]
    assert len(auth) == 1 and "off" in auth[0], up.lines


def test_up_with_keys_says_so_and_refuses_a_keyless_client(tmp_path: Path) -> None:
    from sloserve.client import Unauthenticated

    keys = tmp_path / "keys"
    keys.write_text("up-key-1\nup-key-2\n")
    u = Up(tmp_path, "--api-key-file", str(keys))
    try:
        assert u.ready.wait(90), u.lines
        auth = [ln for ln in u.lines if ln.startswith("auth")]
        assert len(auth) == 1 and "required (2 configured)" in auth[0], u.lines
        with pytest.raises(Unauthenticated):
            list(Client(f"127.0.0.1:{u.port}").generate("hi", max_tokens=2, timeout=10))
        ok = list(Client(f"127.0.0.1:{u.port}", api_key="up-key-2").generate(
            "hi", max_tokens=2, timeout=10))
        assert len(ok) == 2
    finally:
        u.proc.send_signal(signal.SIGTERM)
        assert u.proc.wait(timeout=20) == 0
