"""``sloserve up`` checks its flags before it starts anything (issue 12, item 5).

Each check raises ``ValueError("--flag: why")``; the CLI prints that one line and
exits 2. What is checked is what a child service would otherwise die on a minute
later: the model preset (the perf-model service fits every backend's model by its
preset shape), the GPU (sim: a profiled GPU; torch/vllm: ``cpu``, ``cuda[:N]`` or a
known GPU name, which means CUDA: torch then needs ``torch.cuda.is_available()``), the
weights path, the gateway's two ports (in range, not the same one, and free: a port
another server answers on, another ``sloserve up`` say, would pass the gateway's health
check before the gateway itself died of it), and the Redis URL (parsed, then one PING
within ``REDIS_TIMEOUT_S``, password included). ``--policy`` and ``--backend`` are
argparse choices, rejected before this runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from sloserve.services.executor.backends import SIM, TORCH, VLLM
from sloserve.services.store import redis_url

REDIS_TIMEOUT_S = 2.0
_CUDA = re.compile(r"^cuda(:\d+)?$")


def _flag(flag: str, exc: ValueError) -> ValueError:
    """``exc``'s message under ``flag`` (core errors name the field without dashes)."""
    msg = str(exc)
    for field in ("model/gpu: ", "model: ", "gpu: ", "hardware: ", "weights: "):
        if msg.startswith(field):
            msg = msg[len(field):]
            break
    return ValueError(f"{flag}: {msg}")


def check_model_and_gpu(backend: str, model: str, gpu: str) -> None:
    from sloserve.perf.hardware import get_hardware, hardware_names
    from sloserve.perf.models import get_model

    try:
        get_model(model)
    except ValueError as exc:
        raise _flag("--model", exc) from None
    if backend == SIM:
        from sloserve.perf.profiles import load_mlp_profile

        try:
            get_hardware(gpu)
        except ValueError as exc:
            raise _flag("--gpu", exc) from None
        try:
            load_mlp_profile(model, gpu)
        except ValueError as exc:
            raise _flag("--model/--gpu", exc) from None
    elif not (gpu == "cpu" or _CUDA.match(gpu) or gpu.lower() in hardware_names()):
        raise ValueError(f"--gpu: {backend} runs on 'cpu', 'cuda[:N]' or a CUDA GPU "
                         f"({', '.join(hardware_names())}), got {gpu!r}")


def check_weights(backend: str, model: str, weights: str | None) -> None:
    if weights is None:
        if backend == VLLM:
            from sloserve.services.model_store import PREPARABLE

            if model.lower() not in PREPARABLE:
                raise ValueError(f"--model: vllm needs --weights DIR for {model!r}; only "
                                 f"{list(PREPARABLE)} can be prepared locally")
        return
    if backend == SIM:
        raise ValueError("--weights: the sim backend loads no weights; use --backend torch|vllm")
    path = Path(weights)
    if not path.exists():
        raise ValueError(f"--weights: {weights!r} does not exist")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"--weights: {weights!r} is not a Hugging Face directory "
                             "(no config.json)")
    elif backend == VLLM or path.suffix != ".gguf":
        raise ValueError(f"--weights: {weights!r} is not a Hugging Face directory"
                         + ("" if backend == VLLM else " nor a .gguf file"))


def check_ports(port: int, http_port: int, host: str | None = None) -> None:
    """``--port`` is a TCP port; ``--http-port`` one too, or 0 (no HTTP), and another;
    with ``host``, nothing listens on either there yet."""
    if not 1 <= port <= 65535:
        raise ValueError(f"--port: must be a TCP port in 1..65535, got {port}")
    if not (http_port == 0 or 1 <= http_port <= 65535):
        raise ValueError(f"--http-port: must be 0 (off) or a TCP port in 1..65535, "
                         f"got {http_port}")
    if http_port == port:
        raise ValueError(f"--http-port: {http_port} is also --port (gRPC); pick another")
    if host is None:
        return
    from sloserve.services.rpc import PortInUse, check_port_free

    for flag, value in (("--port", port), ("--http-port", http_port)):
        if value:
            try:
                check_port_free(host, value)
            except PortInUse:
                raise ValueError(f"{flag}: {host}:{value} is already in use (another "
                                 "server listens there); pick another port") from None


def check_cuda(backend: str, gpu: str) -> None:
    """torch on a CUDA GPU needs CUDA here (the executor would die of it at start); vLLM
    picks its own platform, ``--gpu`` only names the hardware for it."""
    if backend != TORCH or gpu == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"--gpu: {gpu!r} means CUDA, which this machine does not have "
                         "(torch.cuda.is_available() is False); use --gpu cpu")
    m = _CUDA.match(gpu)
    if m and m.group(1) and int(m.group(1)[1:]) >= torch.cuda.device_count():
        raise ValueError(f"--gpu: {gpu!r}: this machine has {torch.cuda.device_count()} "
                         "CUDA device(s)")


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # torch/vllm --dtype
DEFAULT_DTYPE = {TORCH: "float32", VLLM: "bfloat16"}  # each backend's own default


def check_dtype(backend: str, dtype: str | None) -> None:
    """``--dtype`` is for the model-running backends, one of ``DTYPE_BYTES``."""
    if dtype is None:
        return
    if backend == SIM:
        raise ValueError("--dtype: the sim backend runs no model; use --backend torch|vllm")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"--dtype: must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (None where there is none)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_memory(backend: str, model: str, gpu: str, dtype: str | None, executors: int,
                      available: int | None = None) -> None:
    """On ``--gpu cpu`` every torch/vllm executor holds the model's weights in this
    machine's memory: refuse what cannot fit (MemAvailable) before anything loads."""
    if backend == SIM or gpu != "cpu":
        return  # a GPU's memory is its engine's to check (vLLM's profiling, torch's fallback)
    from sloserve.perf.models import get_model

    available = available_memory_bytes() if available is None else available
    if available is None:
        return
    name = dtype or DEFAULT_DTYPE[backend]
    need = get_model(model).num_params * DTYPE_BYTES[name] * executors
    if need > available:
        raise ValueError(
            f"--model: {model} needs {need / 1e9:.1f} GB for its weights in {name} "
            f"({executors} executor(s) on --gpu cpu), this machine has "
            f"{available / 1e9:.1f} GB available; use a smaller model, a 2-byte --dtype "
            "or fewer --instances")


def check_redis(explicit: str | None, timeout: float = REDIS_TIMEOUT_S) -> None:
    """The configured Redis (``--redis-url``, else ``$REDIS_URL``) parses and answers PING."""
    url = redis_url(explicit)
    if url is None:
        return  # embedded
    flag = "--redis-url" if explicit else "$REDIS_URL"
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import MasterNotFoundError

    from sloserve.services.redisconn import sync_client
    from sloserve.services.up_cmd import _masked as masked

    try:  # one attempt (redis-py retries with backoff by default: seconds for a dead sentinel)
        client = sync_client(url, socket_connect_timeout=timeout, socket_timeout=timeout,
                             retry=Retry(NoBackoff(), 0))
    except ValueError as exc:
        raise ValueError(f"{flag}: cannot parse {masked(url)!r}: {exc}") from None
    try:
        client.ping()
    except MasterNotFoundError:  # its message is the sentinel client's repr: say it plainly
        raise ValueError(f"{flag}: cannot reach {masked(url)} within {timeout:.0f}s: no "
                         "sentinel answered with the master's address") from None
    except redis.AuthenticationError as exc:
        raise ValueError(f"{flag}: {masked(url)} refused the password: {exc}") from None
    except (redis.RedisError, OSError) as exc:
        raise ValueError(f"{flag}: cannot reach {masked(url)} within {timeout:.0f}s: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None
    finally:
        client.close()


def check_up(backend: str, model: str, gpu: str, weights: str | None,
             redis: str | None, port: int = 50051, http_port: int = 0,
             host: str | None = None, dtype: str | None = None, executors: int = 1) -> None:
    """Every check, cheapest first; the first failure raises. ``host``: the gateway's,
    whose ports must be free (None: not checked)."""
    check_ports(port, http_port, host)
    check_model_and_gpu(backend, model, gpu)
    check_dtype(backend, dtype)
    check_host_memory(backend, model, gpu, dtype, executors)
    check_weights(backend, model, weights)
    check_redis(redis)
    check_cuda(backend, gpu)  # imports torch: last
