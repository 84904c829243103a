"""``sloserve up`` on a bare machine: embedded store, every service up, clean SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sloserve.client import Client
from sloserve.services.store import free_port


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_up_without_redis_serves_and_shuts_down_cleanly(tmp_path: Path) -> None:
    port, http_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    up = subprocess.Popen(
        [sys.executable, "-m", "sloserve.services.cli", "up", "--port", str(port),
         "--http-port", str(http_port), "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = up.stdout.readline()  # type: ignore[union-attr]
            lines.append(line)
            if "gateway ready" in line or not line:
                break
        assert any("(embedded)" in ln for ln in lines), lines
        assert "gateway ready" in lines[-1], lines
        # issue 35: the SLO defaults it uses, and start-up progress per service
        assert any(ln.startswith("slo        defaults TTFT 1 s, TBT 0.15 s") and
                   "never a reason to shed" in ln for ln in lines), lines
        assert sum(ln.startswith("started    ") for ln in lines) == 4, lines
        chunks = list(Client(f"127.0.0.1:{port}").generate("hello", max_tokens=5))
        assert [c.index for c in chunks] == [0, 1, 2, 3, 4]
        models = httpx.get(f"http://127.0.0.1:{http_port}/v1/models").json()  # OpenAI API on
        assert [m["id"] for m in models["data"]] == ["llama-3-8b"]
        scraped = [ln.split("metrics ")[1] for ln in lines if "/metrics" in ln and "metrics http"
                   in ln]
        assert len(scraped) == 4  # every service serves /metrics
        for url in scraped:
            assert "# TYPE" in httpx.get(url.strip()).text
        kids = _children(up.pid)
        assert len(kids) == 4  # perf-model, executor, scheduler, gateway
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=20) == 0
        assert "stopped" in up.stdout.read()  # type: ignore[union-attr]
        assert not [k for k in kids if Path(f"/proc/{k}").exists()
                    and "Z" not in Path(f"/proc/{k}/stat").read_text().split()[2]]
    finally:
        if up.poll() is None:
            up.kill()


def test_up_on_another_host_prints_the_metrics_urls_each_service_listens_on(
        tmp_path: Path) -> None:
    """Issue 36, item 6: with ``--host 127.0.0.2`` the gateway (gRPC, HTTP, its /metrics)
    is on .2 and the internal services on 127.0.0.1; every printed URL answers."""
    host, port, http_port = "127.0.0.2", free_port(), free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "sloserve.services.cli", "up", "--host", host, "--port",
         str(port), "--http-port", str(http_port), "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = up.stdout.readline()  # type: ignore[union-attr]
            lines.append(line)
            if "gateway ready" in line or not line:
                break
        assert "gateway ready" in lines[-1], lines
        printed = {ln.split()[0]: ln.split("metrics ")[1].strip() for ln in lines
                   if "metrics http" in ln}
        assert len(printed) == 4, lines
        for name, url in printed.items():
            want = host if name == "gateway" else "127.0.0.1"
            assert url.startswith(f"http://{want}:"), (name, url)
            assert "# TYPE" in httpx.get(url, timeout=5).text, (name, url)
        api = next(ln for ln in lines if ln.startswith("openai api")).split()[2]
        assert api == f"http://{host}:{http_port}/v1"
        assert httpx.get(f"{api}/models", timeout=5).status_code == 200
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=20)
        except subprocess.TimeoutExpired:
            up.kill()


def test_up_derives_policy_knobs_as_simulate_does_and_turns_offload_off_without_hp(
        tmp_path: Path) -> None:
    from sloserve.services.cli import build_parser
    from sloserve.services.scheduler.main import build_parser as scheduler_parser
    from sloserve.services.scheduler.main import policy_from_args
    from sloserve.services.stack import Stack
    from sloserve.services.up_cmd import config_from_args

    def lp0(*extra: str):  # type: ignore[no-untyped-def]
        args = build_parser().parse_args(["up", "--policy", "ascendra", "--log-dir",
                                          str(tmp_path), *extra])
        stack = Stack(config_from_args(args))
        stack.plan()
        argv = stack.services["scheduler-lp0"].argv[3:]
        return policy_from_args(scheduler_parser().parse_args(argv)).config

    alone = lp0("--instances", "1")
    split = lp0("--instances", "3", "--hp-instances", "1")
    assert alone.offload_threshold == 0.0  # no HP to offload to: an offload would be dropped
    assert split.offload_threshold > 0
    assert split.lp_max_num_seqs == 128  # Ascendra §6.2, as in the simulator
    assert split.token_budget == 2048  # Alg. 1 N = hp_worst_batch_tokens, as in the simulator


def _up(tmp_path: Path, *flags: str, redis: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if redis or k != "REDIS_URL"}
    return subprocess.run(  # a free --port unless flags name one: 50051 may be taken here
        [sys.executable, "-m", "sloserve.services.cli", "up", "--http-port", "0",
         "--port", str(free_port()), "--log-dir", str(tmp_path / "logs"), *flags],
        capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(("flags", "named"), [
    (("--model", "llama-99b"), "--model: unknown preset 'llama-99b'"),
    (("--gpu", "z100"), "--gpu: unknown hardware 'z100'"),
    (("--backend", "torch", "--gpu", "tpu"), "--gpu: torch runs on 'cpu'"),
    (("--backend", "torch", "--model", "smollm2-135m", "--weights", "/no/such/dir"),
     "--weights: '/no/such/dir' does not exist"),
    (("--redis-url", "http://127.0.0.1:6379"), "--redis-url: cannot parse"),
    (("--redis-url", "redis://127.0.0.1:1/0"), "--redis-url: cannot reach"),
    (("--redis-url", "redis+sentinel://127.0.0.1:1"),
     "argument --redis-url: redis+sentinel URL: names no master"),
    (("--redis-url", "redis+sentinel://127.0.0.1:1/m/0"), "--redis-url: cannot reach"),
    (("--policy", "nope"), "argument --policy: invalid choice: 'nope'"),
    (("--backend", "nope"), "argument --backend: invalid choice: 'nope'"),
    (("--http-port", "99999"), "--http-port: must be 0 (off) or a TCP port in 1..65535"),
    (("--port", "0"), "--port: must be a TCP port in 1..65535, got 0"),
    (("--port", "50999", "--http-port", "50999"), "--http-port: 50999 is also --port"),
    (("--backend", "torch", "--model", "smollm2-135m", "--dtype", "fp8"),
     "--dtype: must be one of ['bfloat16', 'float16', 'float32'], got 'fp8'"),
    (("--dtype", "float32"), "--dtype: the sim backend runs no model"),
    # 69 B parameters in float32 on the CPU: 276 GB, more than any machine here has
    (("--backend", "torch", "--model", "llama-2-70b", "--gpu", "cpu"),
     "--model: llama-2-70b needs 275."),
])
def test_up_rejects_a_bad_flag_in_one_line_before_starting_anything(
        tmp_path: Path, flags: tuple[str, ...], named: str) -> None:
    t0 = time.monotonic()
    done = _up(tmp_path, *flags)
    assert time.monotonic() - t0 < 5
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and named in done.stderr, done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "logs").exists()  # no service was started, no log written


@pytest.mark.parametrize("which", ["--port", "--http-port"])
def test_a_gateway_port_another_server_listens_on_is_one_line_before_anything_starts(
        tmp_path: Path, which: str) -> None:
    """Not the gateway's own error at start: another server there (another ``up``, say)
    would answer the health check, and ``up`` would call a gateway ready that died."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _up(tmp_path, which, str(port))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"{which}: 127.0.0.1:{port} is already in use" in done.stderr, done.stderr
    assert not (tmp_path / "logs").exists()


def test_torch_on_a_cuda_gpu_without_cuda_is_one_line_before_anything_starts(
        tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = _up(tmp_path, "--backend", "torch", "--model", "tiny", "--gpu", "a100")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "--gpu: 'a100' means CUDA, which this machine does not have" in done.stderr
    assert not (tmp_path / "logs").exists()


def test_up_prints_the_log_tail_of_a_service_that_dies_at_start(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    bad = tmp_path / "bad.gguf"  # passes the flag checks (a .gguf file), fails to load
    bad.write_text("not a gguf file")
    t0 = time.monotonic()
    done = _up(tmp_path, "--backend", "torch", "--model", "tiny", "--gpu", "cpu",
               "--weights", str(bad))
    assert time.monotonic() - t0 < 45  # not the 60 s health-check timeout
    assert done.returncode == 1, done.stderr
    assert "executor-lp0 exited with code 1 at start; last" in done.stderr, done.stderr
    assert f"  | ValueError: {bad}: not a readable GGUF file" in done.stderr, done.stderr


def test_torch_stacks_wait_for_the_model_load_as_vllm_stacks_do() -> None:
    """A torch executor loads its weights before it answers (past a minute on a busy
    machine): its scheduler and the gateway wait as long as ``up`` does, not 60 s."""
    from sloserve.services.stack import TORCH_START_S, Stack, StackConfig, start_budget

    assert start_budget("sim") == 60.0 and start_budget("torch") == TORCH_START_S > 60
    stack = Stack(StackConfig(backend="torch", model="smollm2-135m", gpu="cpu"))
    stack.plan()
    for name in ("scheduler-lp0", "gateway"):
        argv = stack.services[name].argv
        assert argv[argv.index("--connect-timeout") + 1] == str(TORCH_START_S), name
    sim = Stack(StackConfig())
    sim.plan()
    assert "--connect-timeout" not in sim.services["gateway"].argv


def test_every_executor_gets_the_stacks_one_seed_and_its_own_instance_index() -> None:
    """Executor k of a stack seeded S: ``--seed S --instance k`` (its noise stream is
    ``stream_seed(S, k)``, what ``bench --compare-sim`` replays; torch weights alike)."""
    from sloserve.services.executor.server import build_parser
    from sloserve.services.stack import Stack, StackConfig

    stack = Stack(StackConfig(policy="ascendra", instances=3, hp_instances=1, seed=7))
    stack.plan()
    got = {}
    for k, name in enumerate(("executor-lp0", "executor-lp1", "executor-hp2")):
        argv = stack.services[name].argv
        args = build_parser().parse_args(argv[argv.index("sloserve.services.executor") + 1:])
        got[name] = (args.seed, args.instance)
        assert got[name] == (7, k), got


def test_cpu_executors_whose_weights_exceed_available_memory_are_refused_by_count() -> None:
    """Every torch/vllm executor on ``--gpu cpu`` holds its own weights: the need is
    params x dtype bytes x executors, against MemAvailable; GPUs and sim are not checked."""
    from sloserve.perf.models import get_model
    from sloserve.services.preflight import check_host_memory

    f32 = get_model("llama-3-8b").num_params * 4
    check_host_memory("torch", "llama-3-8b", "cpu", None, 1, available=f32 + 1)
    with pytest.raises(ValueError, match=r"--model: llama-3-8b needs 64\.\d GB for its weights "
                                         r"in float32 \(2 executor\(s\) on --gpu cpu\)"):
        check_host_memory("torch", "llama-3-8b", "cpu", None, 2, available=f32 + 1)
    check_host_memory("torch", "llama-3-8b", "cpu", "bfloat16", 2, available=f32 + 1)
    with pytest.raises(ValueError, match="in bfloat16"):  # vLLM's own default dtype
        check_host_memory("vllm", "llama-3-8b", "cpu", None, 3, available=f32 + 1)
    check_host_memory("torch", "llama-3-8b", "cuda", None, 8, available=1)
    check_host_memory("sim", "llama-3-8b", "cpu", None, 8, available=1)
