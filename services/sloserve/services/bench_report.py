"""How ``sloserve bench`` shows a result: ``vllm bench serve``'s printed block, the result
file (vLLM's ``--result-filename`` JSON), and the ``--plot`` PNGs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sloserve.services.bench_metrics import PER_REQUEST_KEYS, VLLM_SCALARS

_HEADERS = {"ttft": ("TTFT", "Time to First Token"),
            "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
            "itl": ("ITL", "Inter-token Latency"),
            "e2el": ("E2EL", "End-to-end Latency")}
PLOTS = ("ttft_cdf.png", "itl_cdf.png")
RATE_PLOT = "goodput_vs_rate.png"


def _line(label: str, value: Any) -> str:
    text = f"{value:<10.2f}" if isinstance(value, float) else f"{value!s:<10}"
    return f"{label:<40} {text}"


def format_vllm(out: dict[str, Any]) -> str:
    """The block ``vllm bench serve`` prints, from a result's vLLM keys (times in ms)."""
    dur = out["duration"]
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             _line("Successful requests:", out["completed"]),
             _line("Failed requests:", out["failed"]),
             _line("Request rate configured (RPS):", float(out["request_rate"])),
             _line("Benchmark duration (s):", float(dur) if dur is not None else "-"),
             _line("Total input tokens:", out["total_input_tokens"]),
             _line("Total generated tokens:", out["total_output_tokens"]),
             _line("Request throughput (req/s):", out["request_throughput"])]
    if out["request_goodput"] is not None:
        lines.append(_line("Request goodput (req/s):", out["request_goodput"]))
    lines += [_line("Output token throughput (tok/s):", out["output_throughput"]),
              _line("Total token throughput (tok/s):", out["total_token_throughput"])]
    for name, (short, header) in _HEADERS.items():
        if f"mean_{name}_ms" not in out:
            continue
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        lines.append(_line(f"Mean {short} (ms):", out[f"mean_{name}_ms"]))
        lines.append(_line(f"Median {short} (ms):", out[f"median_{name}_ms"]))
        suffix = f"_{name}_ms"
        for key, value in out.items():
            if key.startswith("p") and key.endswith(suffix):
                lines.append(_line(f"P{key[1:-len(suffix)]} {short} (ms):", value))
    lines.append("=" * 50)
    return "\n".join(lines)


def scalars(out: dict[str, Any]) -> dict[str, Any]:
    """A result without its per-request arrays (what ``--json`` prints)."""
    return {k: v for k, v in out.items() if k not in PER_REQUEST_KEYS}


def ours(out: dict[str, Any]) -> dict[str, Any]:
    """The scalars ``format_vllm`` does not show: our SLO metrics and who served the run."""
    return {k: v for k, v in scalars(out).items()
            if k not in VLLM_SCALARS and not k.endswith("_ms") and k != "compare_sim"}


def write_results(path: str, results: Sequence[dict[str, Any]]) -> None:
    """One JSON object per rate, one per line (vLLM's ``--append-result`` layout; a single
    rate is a plain JSON file), per-request arrays included as vLLM writes them."""
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in results))


def _ecdf(ax: Any, values: list[float], label: str) -> None:
    xs = sorted(values)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=label)


def plot(directory: str, results: Sequence[dict[str, Any]]) -> list[Path]:
    """TTFT and ITL CDFs (one curve per rate, completed requests) and, for several rates,
    goodput vs request rate; returns the PNGs written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (key, title) in zip(PLOTS, (("ttfts", "TTFT"), ("itls", "ITL"))):
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in results:
            vals = r[key]
            ms = ([1000 * v for v in vals if v is not None] if key == "ttfts"
                  else [1000 * g for gaps in vals for g in gaps])
            if ms:
                _ecdf(ax, ms, f"{r['request_rate']:g} req/s")
        ax.set_xlabel(f"{title} (ms)")
        ax.set_ylabel("fraction of " + ("requests" if key == "ttfts" else "token gaps"))
        ax.set_title(f"{title} CDF ({results[0]['model']}, {results[0]['endpoint']})")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)
        written.append(out_dir / name)
    if len(results) > 1:
        rates = [r["request_rate"] for r in results]
        vllm_goodput = results[0]["request_goodput"] is not None
        key, label = (("request_goodput", "request_goodput (--goodput)") if vllm_goodput
                      else ("goodput_rps", "goodput_rps (--ttft-slo/--tbt-slo)"))
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(rates, [r["request_throughput"] for r in results], "o--",
                label="request_throughput")
        ax.plot(rates, [r[key] or 0.0 for r in results], "o-", label=label)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("req/s")
        ax.set_title(f"Goodput vs rate ({results[0]['model']}, {results[0]['endpoint']})")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / RATE_PLOT, dpi=120)
        plt.close(fig)
        written.append(out_dir / RATE_PLOT)
    return written
