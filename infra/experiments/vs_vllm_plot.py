"""The PNG of ``vs_vllm.py``: goodput share, TTFT P99 and TBT P99 vs arrival rate, per arm."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slo = result["slo"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = (("goodput_share", "goodput share", None, 0.9),
              ("ttft_p99", "TTFT P99 (s)", slo["ttft_slo"], None),
              ("tbt_p99", "TBT P99 (s, pooled token gaps)", slo["tbt_slo"], None))
    for ax, (key, label, slo_line, target) in zip(axes, panels):
        for arm, res in result["arms"].items():
            rows = sorted(res["rows"], key=lambda r: r["qps"])
            xs = [r["qps"] for r in rows if r["summary"][key] is not None]
            ys = [r["summary"][key] for r in rows if r["summary"][key] is not None]
            style = "--" if arm.startswith("vllm-serve") else "-"
            ax.plot(xs, ys, style, marker="o", label=arm)
        if slo_line is not None:
            ax.axhline(slo_line, color="grey", lw=0.8, ls=":", label="SLO")
            ax.set_yscale("log")
        if target is not None:
            ax.axhline(target, color="grey", lw=0.8, ls=":", label="90 %")
            ax.set_ylim(-0.02, 1.02)
        ax.set_xscale("log")
        ax.set_xlabel("arrival rate (req/s, Poisson, log scale)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{result['model']} on this CPU ({slo['dtype']}), ShareGPT/{result['scale']}, "
                 f"{result['num_requests']} requests per rate; TTFT SLO {slo['ttft_slo']:.3g} s, "
                 f"TBT SLO {slo['tbt_slo']:.3g} s, budget {slo['token_budget']}")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
