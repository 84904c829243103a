"""Generated protobuf/gRPC code for ``protos/sloserve/v1``, built on first import.

``protos/`` is the only source: on import we run ``grpc_tools.protoc`` over it
(when the generated code is missing or stale, under a file lock so concurrent
processes agree) into ``services/_gen/`` (git-ignored), or into
``~/.cache/sloserve`` when the package directory is read-only. The generated
modules import each other as ``sloserve.v1.*`` (the proto package), so the
output directory is added to ``sloserve.__path__``: ``sloserve.v1`` is then the
generated package. ``infra/gen_protos.sh`` does the same ahead of time.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import os
import shutil
from pathlib import Path
from types import ModuleType

import sloserve

PROTO_FILES = ("common", "gateway", "scheduler", "executor", "perfmodel")
_HERE = Path(__file__).resolve().parent


def proto_root() -> Path:
    """Directory holding ``sloserve/v1/*.proto`` (``SLOSERVE_PROTOS`` overrides)."""
    env = os.environ.get("SLOSERVE_PROTOS")
    for cand in ([Path(env)] if env else []) + [_HERE.parent / "protos", _HERE / "protos"]:
        if (cand / "sloserve" / "v1" / "common.proto").is_file():
            return cand
    raise RuntimeError(
        "protos: sloserve/v1/*.proto not found next to the package; set SLOSERVE_PROTOS"
    )


def _digest(root: Path) -> str:
    import grpc_tools

    h = hashlib.sha256(getattr(grpc_tools, "__file__", "").encode())
    for name in PROTO_FILES:
        h.update((root / "sloserve" / "v1" / f"{name}.proto").read_bytes())
    return h.hexdigest()[:16]


def _writable_dir() -> Path:
    if os.access(_HERE / "_gen", os.W_OK):
        return _HERE / "_gen"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sloserve" / "gen"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def generate(out: Path, root: Path) -> None:
    """Run protoc (grpcio-tools) over every proto into ``out/sloserve/v1``."""
    from grpc_tools import protoc

    tmp = out / ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = [f"sloserve/v1/{n}.proto" for n in PROTO_FILES]
    include = str(Path(protoc.__file__).parent / "_proto")
    rc = protoc.main(
        ["protoc", f"-I{root}", f"-I{include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
         f"--grpc_python_out={tmp}", *files]
    )
    if rc != 0:
        raise RuntimeError(f"protos: protoc failed with code {rc} on {root}")
    shutil.rmtree(out / "sloserve", ignore_errors=True)
    (tmp / "sloserve").rename(out / "sloserve")
    shutil.rmtree(tmp)


def ensure_generated() -> Path:
    root = proto_root()
    out = _writable_dir()
    stamp = out / "STAMP"
    digest = _digest(root)
    if not (stamp.is_file() and stamp.read_text() == digest):
        with open(out / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (stamp.is_file() and stamp.read_text() == digest):
                generate(out, root)
                stamp.write_text(digest)
    return out


def _load() -> dict[str, ModuleType]:
    out = ensure_generated()
    pkg_dir = str(out / "sloserve")
    if pkg_dir not in sloserve.__path__:
        sloserve.__path__.append(pkg_dir)
    mods: dict[str, ModuleType] = {}
    for name in PROTO_FILES:
        mods[name] = importlib.import_module(f"sloserve.v1.{name}_pb2")
        mods[f"{name}_grpc"] = importlib.import_module(f"sloserve.v1.{name}_pb2_grpc")
    return mods


_M = _load()
common_pb2 = _M["common"]
gateway_pb2, gateway_grpc = _M["gateway"], _M["gateway_grpc"]
scheduler_pb2, scheduler_grpc = _M["scheduler"], _M["scheduler_grpc"]
executor_pb2, executor_grpc = _M["executor"], _M["executor_grpc"]
perfmodel_pb2, perfmodel_grpc = _M["perfmodel"], _M["perfmodel_grpc"]

SERVICE_NAMES = {
    "gateway": "sloserve.v1.Gateway",
    "scheduler": "sloserve.v1.Scheduler",
    "executor": "sloserve.v1.Executor",
    "perfmodel": "sloserve.v1.PerfModel",
}
