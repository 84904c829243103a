"""A sweep's table as PNG plots and a static ``index.html`` (issue 37, item 3).

* capacity per policy per cell: one bar chart per criterion, a group of bars (one per
  policy) for each point of the other axes;
* goodput vs rate: for the fixed-rate cells, one chart per point of the other axes, a
  line per policy over the rates.

``index.html`` shows every plot and the table (one row per cell: its axes, the measured
number, where it ran, wall time) and links the raw JSON lines. A small script marks the
page with how many images loaded (``<html data-images="loaded/total">``) and flags any
that did not, so a broken plot is visible (and testable in a headless browser).
"""

from __future__ import annotations

import html
import json
import re
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sloserve.services.sweep.runner import read_table

_SCRIPT = """<script>
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img'), ok = 0;
  imgs.forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { ok += 1; }
    else { img.insertAdjacentHTML('afterend', '<p class="broken">image did not load: ' +
                                  img.getAttribute('src') + '</p>'); }
  });
  document.documentElement.dataset.images = ok + '/' + imgs.length;
});
</script>"""

_STYLE = """<style>
body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; font-size: 0.85em; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; display: block; margin: 1em 0; }
.broken, .error { color: #b00; }
</style>"""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "x"


def _others(row: dict[str, Any], drop: Sequence[str]) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in row["labels"].items() if k not in drop)


def _policy(row: dict[str, Any]) -> str:
    labels: dict[str, str] = row["labels"]
    return labels.get("policy", str(row["config"].get("policy")))


def _group_name(key: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(v for _, v in key) or "all"


def _capacity_plots(rows: list[dict[str, Any]], out: Path) -> list[tuple[str, str]]:
    import matplotlib.pyplot as plt

    by_crit: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_crit[r["config"]["criterion"]].append(r)
    made = []
    for crit, rs in sorted(by_crit.items()):
        groups = list(dict.fromkeys(_others(r, ("policy", "measure")) for r in rs))
        policies = list(dict.fromkeys(_policy(r) for r in rs))
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * len(policies) / 2 + 3),
                                        4.5))
        width = 0.8 / max(1, len(policies))
        for j, pol in enumerate(policies):
            xs, ys, limit = [], [], []
            for i, g in enumerate(groups):
                hit = [r for r in rs if _others(r, ("policy", "measure")) == g
                       and _policy(r) == pol]
                if hit:
                    xs.append(i + (j - (len(policies) - 1) / 2) * width)
                    ys.append(hit[0]["result"]["capacity_qps"])
                    limit.append(bool(hit[0]["result"].get("at_search_limit")))
            bars = ax.bar(xs, ys, width, label=pol)
            for b, lim in zip(bars, limit):
                if lim:  # met at the search limit: a lower bound
                    ax.annotate(">=", (b.get_x() + b.get_width() / 2, b.get_height()),
                                ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([_group_name(g) for g in groups], rotation=20, ha="right",
                           fontsize=8)
        ax.set_ylabel("capacity (req/s)")
        target = rs[0]["config"].get("target")
        ax.set_title(f"capacity, {crit} criterion (target {target})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"capacity-{_slug(crit)}.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        made.append((name, f"Capacity per policy, {crit} criterion"))
    return made


def _rate_plots(rows: list[dict[str, Any]], out: Path) -> list[tuple[str, str]]:
    import matplotlib.pyplot as plt

    by_group: dict[tuple[tuple[str, str], ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_group[_others(r, ("policy", "measure"))].append(r)
    made = []
    for n, (g, rs) in enumerate(by_group.items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for pol in dict.fromkeys(_policy(r) for r in rs):
            pts = sorted((r["config"]["qps"], r["result"]["goodput_share"]) for r in rs
                         if _policy(r) == pol and r["result"].get("goodput_share") is not None)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=pol)
        ax.axhline(0.9, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("goodput share")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"goodput vs rate: {_group_name(g)}", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"goodput-{n:02d}-{_slug(_group_name(g))}.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        made.append((name, f"Goodput vs rate: {_group_name(g)}"))
    return made


def _measured(row: dict[str, Any]) -> str:
    if "error" in row:
        return "error"
    res = row["result"]
    if row["kind"] == "capacity":
        bound = ">= " if res.get("at_search_limit") else ""
        return f"{bound}{res['capacity_qps']:g} req/s"
    share = res.get("goodput_share")
    return "n/a" if share is None else f"goodput {share:.3f}"


def _table(rows: list[dict[str, Any]]) -> str:
    axes = list(dict.fromkeys(k for r in rows for k in r["labels"]))
    head = ["cell", "kind", *axes, "result", "host", "node", "wall (s)"]
    out = ["<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
           + "</tr></thead><tbody>"]
    for r in rows:
        node = str(r.get("node_id") or "")[:8]
        cells = [f'<td title="{html.escape(r.get("command", ""))}"><code>'
                 f"{html.escape(r['cell'])}</code></td>",
                 f"<td>{html.escape(r['kind'])}</td>",
                 *(f"<td>{html.escape(str(r['labels'].get(a, '')))}</td>" for a in axes),
                 (f'<td class="error" title="{html.escape(r["error"])}">error</td>'
                  if "error" in r else f'<td class="num">{html.escape(_measured(r))}</td>'),
                 f"<td>{html.escape(str(r.get('host', '')))}</td>",
                 f"<td><code>{html.escape(node)}</code></td>",
                 f'<td class="num">{r.get("wall_s", "")}</td>']
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def write_report(results: Path, out: Path) -> Path:
    """Plots and ``index.html`` for the table at ``results`` into ``out``; returns the
    page. The last row of a cell wins (a re-run after an error)."""
    import matplotlib

    matplotlib.use("Agg")
    if not results.is_file():
        raise ValueError(f"RESULTS: no such file: {results}")
    rows_all = read_table(results)
    if not rows_all:
        raise ValueError(f"RESULTS: {results} has no rows")
    last: dict[str, dict[str, Any]] = {}
    for r in rows_all:
        for key in ("kind", "labels", "config"):
            if key not in r:
                raise ValueError(f"RESULTS: row {r['cell']} has no {key!r}: not a sweep table")
        last[r["cell"]] = r
    # in the spec's order (a row's ``index``), not the order cells finished in
    rows = sorted(last.values(), key=lambda r: (str(r.get("spec", "")), r.get("index", 0)))
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in rows if "error" not in r]
    plots = (_capacity_plots([r for r in ok if r["kind"] == "capacity"], out)
             + _rate_plots([r for r in ok if r["kind"] == "simulate"], out))
    shutil.copyfile(results, out / "results.jsonl")
    nodes = sorted({str(r.get("node_id")) for r in ok})
    hosts = sorted({str(r.get("host")) for r in ok})
    names = sorted({str(r.get("spec", "")) for r in rows})
    failed = len(rows) - len(ok)
    title = f"sweep {', '.join(names)}"
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p>{len(rows)} cells ({len(ok)} with results"
            + (f', <span class="error">{failed} failed</span>' if failed else "")
            + f"), run on {len(nodes)} Ray node(s) on {len(hosts)} host(s); "
            f'raw table: <a href="results.jsonl">results.jsonl</a>. Hover a cell hash for '
            "its command line.</p>"]
    for name, caption in plots:
        body += [f"<h2>{html.escape(caption)}</h2>",
                 f'<img src="{html.escape(name)}" alt="{html.escape(caption)}">']
    body += ["<h2>Cells</h2>", _table(rows)]
    page = ("<!doctype html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title>{_STYLE}</head>\n<body>\n"
            + "\n".join(body) + f"\n{_SCRIPT}\n</body></html>\n")
    index = out / "index.html"
    index.write_text(page)
    (out / "plots.json").write_text(json.dumps([n for n, _ in plots]) + "\n")
    return index
