"""argparse types the commands share: a bounded, finite number, refused naming the flag."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

_NAMES = {int: "an integer", float: "a number"}


def number(kind: type, minimum: float, strict: bool = True) -> Callable[[str], Any]:
    """``kind(text)``, finite and ``> minimum`` (``>=`` unless ``strict``); argparse puts
    the flag's name before the message."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {_NAMES.get(kind, kind.__name__)}") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum}, "
                                             f"got {text}")
        return value

    return parse


def positive(kind: type) -> Callable[[str], Any]:
    """A finite ``kind`` > 0."""
    return number(kind, 0)
