"""``sloserve`` command line: one subcommand per module, each a thin shell.

Every subcommand module exposes ``add_parser(subparsers)`` and ``run(args) -> int``.
Bad arguments print one line naming the flag and exit with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from sloserve.services.argtypes import DefaultsHelpFormatter

# subcommand -> module under sloserve.services
SUBCOMMANDS = {
    "simulate": "sim_cmd",
    "capacity": "sim_cmd",
    "compare": "sim_cmd",
    "plan": "plan_cmd",
    "profile": "profile_cmd",
    "up": "up_cmd",
    "bench": "bench_cmd",
    "model": "model_cmd",
    "soak": "soak_cmd",
    "sweep": "sweep_cmd",
    "render": "render_cmd",
}


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)  # --help shows defaults
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sloserve", description="SLO-aware LLM serving")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    seen: set[str] = set()
    for module in SUBCOMMANDS.values():
        if module in seen:
            continue
        seen.add(module)
        try:
            mod = importlib.import_module(f"sloserve.services.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"sloserve.services.{module}":
                raise
            continue
        mod.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    mod = importlib.import_module(f"sloserve.services.{SUBCOMMANDS[args.command]}")
    try:
        return int(mod.run(args))
    except ValueError as exc:  # bad input that only the core can judge
        print(f"sloserve {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
