"""Request-length traces: the vendored ones by name, or any CSV / JSON-lines file.

A trace is a list of :class:`TraceRequest` (prompt length, output length and,
when the file has one, an arrival time in seconds from the first request).
Column names are matched case-insensitively against the synonyms below;
``docs/workloads-and-metrics.md`` lists the accepted formats and the unit rules.
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any


class TraceError(ValueError):
    """A trace file that cannot be used; the message is one line naming the file."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    prompt_len: int
    output_len: int
    arrival: float | None = None  # seconds from the first request of the trace
    # prefix identity: Mooncake ``hash_ids``, one id per 512-token block (sloserve.kv_prefix)
    hash_ids: tuple[int, ...] | None = None
    # session identity (a conversation's turns share it): ``SESSION_COLUMNS``; with either
    # identity a trace is sampled in its own order by default (``workload.generate``)
    session: str | None = None


# name -> file in sloserve/data/traces (gzip-compressed, unmodified; see its README.md)
TRACE_FILES: dict[str, str] = {
    "sharegpt": "sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz",
    "arxiv": "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv.gz",
    "bwb": "bwb_stats_llama2_tokenizer_filtered_v2.csv.gz",
    "azure-conv": "AzureLLMInferenceTrace_conv.csv.gz",
    "azure-code": "AzureLLMInferenceTrace_code.csv.gz",
}

PROMPT_COLUMNS = (
    "num_prefill_tokens",
    "ContextTokens",
    "input_len",
    "prompt_len",
    "input_length",
    "prompt_length",
    "prompt_tokens",
    "input_tokens",
    "num_prompt_tokens",
    "num_input_tokens",
    "context_tokens",
    "context_len",
)
OUTPUT_COLUMNS = (
    "num_decode_tokens",
    "GeneratedTokens",
    "output_len",
    "output_length",
    "completion_tokens",
    "output_tokens",
    "generated_tokens",
    "num_output_tokens",
    "num_generated_tokens",
    "response_len",
    "response_length",
    "decode_tokens",
)
# a conversation (session) id, when the file has one
SESSION_COLUMNS = ("session_id", "conversation_id", "chat_id", "session", "conversation")
# (column, unit): unit None = seconds, or epoch ms/us/ns decided by magnitude.
ARRIVAL_COLUMNS: tuple[tuple[str, float | None], ...] = (
    ("arrived_at", None),
    ("arrival_time", None),
    ("arrival", None),
    ("timestamp", None),
    ("time", None),
    ("ts", None),
    ("created_at", None),
    ("arrival_timestamp", None),
    ("arrived_at_s", 1.0),
    ("arrival_time_s", 1.0),
    ("timestamp_s", 1.0),
    ("arrived_at_ms", 1e-3),
    ("arrival_time_ms", 1e-3),
    ("arrival_ms", 1e-3),
    ("timestamp_ms", 1e-3),
    ("time_ms", 1e-3),
    ("ts_ms", 1e-3),
    ("arrival_time_us", 1e-6),
    ("timestamp_us", 1e-6),
    ("arrival_time_ns", 1e-9),
    ("timestamp_ns", 1e-9),
)
# Unitless numeric arrivals are seconds, except epoch values: 1e11 s is the year
# 5138 but 1e11 ms is 1973, so larger magnitudes are read as epoch ms / us / ns.
_EPOCH_UNITS = ((1e17, 1e-9), (1e14, 1e-6), (1e11, 1e-3))

_TIMESTAMP = re.compile(
    r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}(?::\d{2})?)(?:[.,](\d+))?\s*(Z|[+-]\d{2}:?\d{2})?",
    re.IGNORECASE,
)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _norm(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


def trace_names() -> list[str]:
    """Names of the vendored traces (``load_trace`` accepts these)."""
    return list(TRACE_FILES)


def load_trace(name: str) -> list[TraceRequest]:
    """A vendored trace by name (memoised), or a trace file when ``name`` is a path."""
    if name in TRACE_FILES:
        return list(_load_vendored(name))
    if Path(name).suffix or "/" in name:
        return load_trace_file(name)
    raise TraceError(
        f"unknown trace {name!r} (known: {', '.join(TRACE_FILES)}; or a CSV/JSONL path)"
    )


@functools.cache
def _load_vendored(name: str) -> tuple[TraceRequest, ...]:
    ref = resources.files("sloserve.data.traces").joinpath(TRACE_FILES[name])
    with resources.as_file(ref) as path:
        return tuple(load_trace_file(path))


def load_trace_file(path: str | Path) -> list[TraceRequest]:
    """Parse a CSV or JSON-lines trace (optionally ``.gz``); sorted by arrival.

    Lengths must be positive integers (``"415.0"`` is accepted); an output
    length of 0 is clamped to 1 token, because a served request always samples
    at least one token. Arrivals, when present, are re-based so the first is 0.
    """
    path = Path(path)
    try:
        return _parse(path, _records(path))
    except TraceError:
        raise
    except (OSError, UnicodeDecodeError, EOFError, csv.Error) as exc:
        raise TraceError(f"{path}: cannot read: {exc}".replace("\n", " ")) from exc


def _open(path: Path) -> Any:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, row) from a CSV or JSON-lines file."""
    stem = path.name[:-3] if path.suffix == ".gz" else path.name
    with _open(path) as f:
        head = f.read(4096)
        f.seek(0)
        if not head.strip():
            raise TraceError(f"{path}: file is empty")
        if Path(stem).suffix in (".jsonl", ".ndjson", ".json") or head.lstrip().startswith("{"):
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{path} line {lineno}: not valid JSON ({exc.msg})") from exc
                if not isinstance(row, dict):
                    raise TraceError(f"{path} line {lineno}: expected a JSON object per line")
                yield lineno, row
        else:
            reader = csv.DictReader(f)
            for row in reader:
                yield reader.line_num, row


def _find(path: Path, keys: list[str], wanted: tuple[str, ...], what: str) -> str:
    norm = {_norm(k): k for k in keys if k is not None}
    for name in wanted:
        if _norm(name) in norm:
            return norm[_norm(name)]
    shown = ", ".join(wanted[:4])
    raise TraceError(f"{path}: no {what} column (looked for {shown}, ...; found {', '.join(keys)})")


def _length(path: Path, lineno: int, value: Any, what: str) -> int:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise TraceError(f"{path} line {lineno}: {what} length is missing")
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number != int(number):
        raise TraceError(f"{path} line {lineno}: {what} length {value!r} is not an integer")
    n = int(number)
    if n < 0 or (n == 0 and what == "prompt"):
        raise TraceError(f"{path} line {lineno}: {what} length {n} is not positive")
    return max(n, 1)


def _hash_ids(path: Path, lineno: int, value: Any) -> tuple[int, ...]:
    """A row's ``hash_ids``: a non-empty list of non-negative integers (JSON text in CSV)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise TraceError(f"{path} line {lineno}: hash_ids must be a non-empty list of "
                         f"non-negative integers, got {value!r}"[:300])
    return tuple(value)


def _timestamp(text: str) -> tuple[int, float, bool] | None:
    """Wall-clock text -> (whole seconds since epoch, fraction, has_timezone)."""
    m = _TIMESTAMP.fullmatch(text.strip())
    if m is None:
        return None
    date, clock, frac, tz = m.groups()
    tz = None if tz is None else ("+00:00" if tz.upper() == "Z" else tz)
    dt = datetime.fromisoformat(f"{date}T{clock}{tz or ''}")
    whole = int((dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp())
    return whole, (int(frac) / 10 ** len(frac) if frac else 0.0), tz is not None


def _arrivals(path: Path, raw: list[tuple[int, Any]], unit: float | None) -> list[float]:
    """Arrival values (numbers or wall-clock text) -> seconds from the first."""
    first_line, first = raw[0]
    numeric = not isinstance(first, str) or _timestamp(first) is None
    if numeric:
        values: list[float] = []
        for lineno, v in raw:
            try:
                values.append(float(v))
            except (TypeError, ValueError):
                values.append(math.nan)
            if not math.isfinite(values[-1]):
                raise TraceError(f"{path} line {lineno}: arrival time {v!r} is not a number")
        if unit is None:
            unit = next((u for bound, u in _EPOCH_UNITS if abs(values[0]) >= bound), 1.0)
        t0 = min(values)
        return [(v - t0) * unit for v in values]
    parsed: list[tuple[int, float]] = []
    aware = _timestamp(first)[2]  # type: ignore[index]
    for lineno, v in raw:
        ts = _timestamp(v) if isinstance(v, str) else None
        if ts is None:
            raise TraceError(f"{path} line {lineno}: arrival time {v!r} is not a timestamp")
        if ts[2] != aware:
            raise TraceError(
                f"{path} line {lineno}: arrival time {v!r} mixes time-zone-aware and naive "
                f"timestamps (line {first_line} is {'aware' if aware else 'naive'})"
            )
        parsed.append(ts[:2])
    w0, f0 = min(parsed)
    return [(w - w0) + (f - f0) for w, f in parsed]


@dataclass(frozen=True, slots=True)
class _Columns:
    """Which columns of a trace hold what (found from its first row)."""

    prompt: str
    output: str
    arrival: str | None = None
    unit: float | None = None  # seconds per arrival-column unit
    hash_ids: str | None = None
    session: str | None = None


def _columns(path: Path, row: dict[str, Any]) -> _Columns:
    keys = [k for k in row if k is not None]
    norm = {_norm(k): k for k in keys}
    arrival, unit = next(((norm[name], u) for name, u in ARRIVAL_COLUMNS if name in norm),
                         (None, None))
    hash_col = norm.get("hash_ids")
    if hash_col is not None and arrival == norm.get("timestamp"):
        unit = 1e-3  # Mooncake traces: ``timestamp`` in ms from the trace start
    return _Columns(_find(path, keys, PROMPT_COLUMNS, "prompt-length"),
                    _find(path, keys, OUTPUT_COLUMNS, "output-length"), arrival, unit,
                    hash_col, next((norm[c] for c in SESSION_COLUMNS if c in norm), None))


def _present(path: Path, lineno: int, row: dict[str, Any], col: str, what: str) -> Any:
    """``row[col]``, refused naming the line when it is missing or blank."""
    value = row.get(col)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise TraceError(f"{path} line {lineno}: {what} is missing")
    return value


def _parse(path: Path, records: Iterator[tuple[int, dict[str, Any]]]) -> list[TraceRequest]:
    cols: _Columns | None = None
    lengths: list[tuple[int, int]] = []
    hashes: list[tuple[int, ...] | None] = []
    sessions: list[str | None] = []
    raw_arrivals: list[tuple[int, Any]] = []
    for lineno, row in records:
        cols = cols or _columns(path, row)
        hashes.append(None if cols.hash_ids is None else _hash_ids(
            path, lineno, _present(path, lineno, row, cols.hash_ids, "hash_ids")))
        sessions.append(None if cols.session is None else str(
            _present(path, lineno, row, cols.session, cols.session)).strip())
        lengths.append((_length(path, lineno, row.get(cols.prompt), "prompt"),
                        _length(path, lineno, row.get(cols.output), "output")))
        if cols.arrival is not None:
            raw_arrivals.append(
                (lineno, _present(path, lineno, row, cols.arrival, "arrival time")))
    if cols is None or not lengths:
        raise TraceError(f"{path}: no requests (header only)")
    if cols.arrival is None:
        return [TraceRequest(p, o, hash_ids=h, session=s)
                for (p, o), h, s in zip(lengths, hashes, sessions)]
    times = _arrivals(path, raw_arrivals, cols.unit)
    order = sorted(range(len(times)), key=times.__getitem__)
    return [TraceRequest(*lengths[i], arrival=times[i], hash_ids=hashes[i], session=sessions[i])
            for i in order]
