"""``sloserve render compose|k8s FILE``: a deployment description as docker-compose YAML
or Kubernetes manifests (issue 34, item 4; the rendering is ``sloserve.render``).

``compose``: one file (``--out FILE``, default stdout). ``k8s``: ``sloserve.yaml`` and
``kustomization.yaml`` (``--out DIR``; default: the manifests on stdout).
``--gpu-variant`` (k8s): executors on the vLLM CUDA image with ``nvidia.com/gpu``.
A bad description is one line naming the key, exit 2, and nothing written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sloserve.render import load_description, render_compose, render_k8s


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("render", help="render a deployment description for docker "
                                             "compose or Kubernetes")
    p.add_argument("target", choices=("compose", "k8s"))
    p.add_argument("description", help="the description file (YAML; infra/deployments/)")
    p.add_argument("--gpu-variant", action="store_true",
                   help="k8s: executors on the vLLM CUDA image, one nvidia.com/gpu each")
    p.add_argument("--out", default=None,
                   help="compose: the file; k8s: the directory (default: stdout)")


def run(args: argparse.Namespace) -> int:
    try:
        text = Path(args.description).read_text()
    except OSError as exc:
        raise ValueError(f"description: cannot read {args.description}: "
                         f"{exc.strerror or exc}") from None
    desc = load_description(text)
    source = args.description
    if args.target == "compose":
        if args.gpu_variant:
            raise ValueError("--gpu-variant: Kubernetes only (render k8s)")
        out = render_compose(desc, source, args.out or "docker-compose.yml")
        if args.out is None:
            sys.stdout.write(out)
        else:
            Path(args.out).write_text(out)
        return 0
    files = render_k8s(desc, args.gpu_variant, source, args.out or "infra/k8s")
    if args.out is None:
        sys.stdout.write(files["sloserve.yaml"])
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        (Path(args.out) / name).write_text(body)
    return 0
