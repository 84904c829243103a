"""The PNG of ``prefix_caching.py``: capacity, hit rate and TTFT per arm.

Usage: python infra/experiments/prefix_caching_plot.py [RESULT_JSON] [PNG]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def plot(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one, four = result["one_instance"], result["four_instances"]
    arms = [("1 inst, no cache", one["off"], "at_off_capacity"),
            ("1 inst, cache", one["on"], "at_off_capacity"),
            ("4 inst, round-robin", four["round_robin"], "at_round_robin_capacity"),
            ("4 inst, prefix-aware", four["prefix_aware"], "at_round_robin_capacity")]
    names = [a for a, _, _ in arms]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    axes[0].bar(names, [r["capacity_qps"] for _, r, _ in arms], color="C0")
    axes[0].set_ylabel("capacity (req/s, goodput >= 90%)")
    axes[1].bar(names, [r[k]["prefix_hit_rate"] or 0.0 for _, r, k in arms], color="C1")
    axes[1].set_ylabel("prefix-cache hit rate (tokens)")
    width = 0.4
    xs = range(len(arms))
    axes[2].bar([x - width / 2 for x in xs], [r[k]["ttft_p50"] for _, r, k in arms], width,
                label="TTFT P50")
    axes[2].bar([x + width / 2 for x in xs], [r[k]["ttft_p99"] for _, r, k in arms], width,
                label="TTFT P99")
    axes[2].set_xticks(list(xs), names)
    axes[2].set_ylabel("seconds, at the no-cache / round-robin capacity")
    axes[2].axhline(result["setup"]["ttft_slo_s"], color="grey", lw=0.8, ls=":", label="SLO")
    axes[2].legend()
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=20)
    policy = result["setup"]["policy"]
    fig.suptitle(f"Prefix caching, multi-turn chats ({policy}, llama-3-8b, simulated A100s)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/prefix_caching.json")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/results/prefix_caching.png")
    plot(json.loads(src.read_text()), out)
