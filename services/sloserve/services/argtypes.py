"""argparse types the commands share: a bounded, finite number, refused naming the flag."""

from __future__ import annotations

import argparse
import copy
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


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` with every flag's default (issue 35, item 4): appended where the help
    does not already say it and there is one to show (not None, not an off switch)."""

    @staticmethod
    def _shows_default(action: argparse.Action) -> bool:
        return bool(action.option_strings) and not action.required and \
            action.default not in (None, False, argparse.SUPPRESS) and \
            "default" not in (action.help or "")

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self._shows_default(action):  # a flag without help text
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if not self._shows_default(action):
            return action.help
        return f"{action.help} (default: %(default)s)"


def redis_url(text: str) -> str:
    """argparse type of ``--redis-url`` (``redisconn.url_arg``), imported when a value is
    parsed: building the CLI's parser stays free of redis-py and its TLS stack."""
    from sloserve.services.redisconn import url_arg

    return url_arg(text)
