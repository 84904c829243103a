"""``sloserve bench --endpoint openai`` against a real stock ``vllm serve`` (SmolLM2-135M).

One server for the module (vLLM's CPU build, ``--enforce-eager`` so it starts
without compiling), then the same replay ``sloserve bench`` runs. It checks
that every request streams exactly its output length (``ignore_eos``), that
token counts come from the server's ``token_ids``, and that the summary has
the gRPC bench's keys (``bench_keys``: our SLO metrics and vllm bench serve's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from bench_keys import RESULT_KEYS

from sloserve.request import Request
from sloserve.services import bench_cmd, bench_openai
from sloserve.services.model_store import resolve
from sloserve.services.store import free_port

START_S = 800.0


# the module fixture (starting stock vllm serve: 100-400 s on a busy 2-core machine) counts
# against the first test's timeout: more than pyproject's 300 s
pytestmark = pytest.mark.timeout(900)

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model_dir = resolve("smollm2-135m")
    port = free_port("127.0.0.1")
    log = tmp_path_factory.mktemp("vllm") / "serve.log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--served-model-name", "smollm2-135m", "--dtype", "float32", "--enforce-eager",
             "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port)],
            stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    target = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    try:
        while True:
            assert proc.poll() is None, f"vllm serve exited: {log.read_text()[-3000:]}"
            assert time.monotonic() - t0 < START_S, f"not ready: {log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{target}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield target
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _args(target: str, trace: Path, **kw: object) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    bench_cmd.add_parser(ap.add_subparsers())
    args = ap.parse_args(["bench", "--endpoint", "openai", "--target", target, "--trace-file",
                          str(trace), "--qps", "20", "--num-requests", "6", "--ttft-slo", "30",
                          "--tbt-slo", "5", "--workload-model", "smollm2-135m",
                          "--goodput", "ttft:30000"])
    for k, v in kw.items():
        setattr(args, k, v)
    return bench_cmd.at_rate(args, args.qps[0])


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    p = tmp_path / "lengths.csv"
    p.write_text("prompt_len,output_len\n12,5\n40,9\n3,1\n70,12\n")
    return p


def test_replay_streams_exact_lengths_with_the_grpc_benchs_keys(server: str, trace: Path) -> None:
    args = _args(server, trace)
    out = asyncio.run(bench_openai.replay(args))
    wanted = [r.output_len for r in bench_cmd.workload(args, "smollm2-135m", "a100")]
    assert out["completed"] == out["requests"] == 6 and out["unfinished"] == 0
    assert out["output_tokens"] == sum(wanted)  # ignore_eos: exactly max_tokens each
    assert out["model"] == "smollm2-135m" and out["endpoint"] == "openai"
    assert 0 < out["ttft_p50"] <= out["ttft_p99"] < 30
    assert out["tbt_p50"] is not None and out["tbt_p50"] > 0
    assert out["goodput_share"] == 1.0  # generous SLOs on an idle server
    assert set(out) == RESULT_KEYS  # the gRPC bench's too (test_bench_conventions.py)
    assert out["completed"] == 6 and out["total_output_tokens"] == sum(wanted)
    assert out["median_tpot_ms"] == pytest.approx(1000 * out["mean_tbt_p50"])


def test_each_chunk_names_its_tokens(server: str) -> None:
    async def one() -> bench_openai.Stream:
        req = Request("r000001", arrival_time=0.0, prompt_len=20, output_len=7)
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            _, stream = await bench_openai.complete(client, bench_openai.body(req, "smollm2-135m",
                                                                              0.0))
        return stream

    stream = asyncio.run(one())
    assert stream.saw_token_ids and stream.usage_tokens == 7 and stream.finish_reason == "length"
    assert sum(k for _, k in stream.chunks) == 7


def test_unknown_model_is_named(server: str, trace: Path) -> None:
    with pytest.raises(ValueError, match=r"model \(--model\): 'nope' is not served"):
        asyncio.run(bench_openai.replay(_args(server, trace, model="nope")))


def test_http_errors_name_the_status(server: str) -> None:
    async def bad() -> None:
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            await bench_openai.complete(client, {"model": "smollm2-135m", "prompt": [1, 2],
                                                 "max_tokens": 100_000, "stream": True})

    with pytest.raises(RuntimeError, match="HTTP 400"):
        asyncio.run(bad())
