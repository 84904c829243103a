"""``docs/reproduction.md`` rendered from sweep specs and their tables (issue 37, item 4).

``sloserve sweep report infra/sweeps --template reproduction --out docs`` writes
``OUT/reproduction.md`` and its plots (``OUT/reproduction/*.png``): the Sarathi-Serve
capacities and Ascendra's Fig. 9 from the specs ``reproduction_sarathi.yaml`` and
``reproduction_ascendra.yaml`` (each cell read from its table by hash, so a result
written for another config is not used), the other rows from the JSON that the paper
experiment tools write to ``OUT/results/reproduction/`` (AccelGen's comparison, Ascendra
§8.4/§8.6, BestServe's OPs). The verdict rule is fixed here, not per claim (``verdict``).
The hand-written discussion after the ``DISCUSSION`` marker of the existing document is
kept. No clock is read: the same tables give the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from sloserve.metrics import MAX_DROP_SHARE, TAIL_SCHED_DELAY
from sloserve.services.sweep.runner import read_table
from sloserve.services.sweep.spec import load_spec

DISCUSSION = (
    "<!-- DISCUSSION: hand-written below this line, kept by "
    "sloserve sweep report --template reproduction -->"
)
SECTIONS = ("sarathi", "ascendra", "accelgen", "bestserve")
SPECS = {"sarathi": "reproduction_sarathi.yaml", "ascendra": "reproduction_ascendra.yaml"}
SCRIPT_RESULTS = Path("results/reproduction")  # under OUT: the experiment tools' JSON
PLOTS = "reproduction"  # under OUT


@dataclasses.dataclass(slots=True)
class Row:
    """One headline claim: what the paper says, what we measured, and the verdict."""

    claim: str
    paper: str
    ours: str
    setup: str
    verdict: str
    why: str


@dataclasses.dataclass
class Inputs:
    """Where the section builders read from: each spec's cells by hash, the tools' JSON."""

    sweeps: Path
    scripts: Path
    plots: Path | None  # None: draw nothing (the text only)


def verdict(paper_ratio: float | None, ours: float | None) -> str:
    """Reproduced: at least half the claimed gain; partly: same direction, less; not: no gain.

    ``paper_ratio`` and ``ours`` are "better/baseline" ratios (> 1: the paper's system wins).
    A claim with no number in the paper's text (``paper_ratio`` None) is judged on direction.
    """
    if ours is None:
        return "not measured"
    if paper_ratio is None:
        return "reproduced" if ours > 1.0 else "not"
    if ours >= 1 + 0.5 * (paper_ratio - 1):
        return "reproduced"
    return "partly" if ours > 1.02 else "not"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def fmt(x: float | None, nd: int = 2, suffix: str = "") -> str:
    return "—" if x is None else f"{x:.{nd}f}{suffix}"


def spec_rows(sweeps: Path, spec_file: str) -> list[dict[str, Any]]:
    """The table row of every cell of ``sweeps/spec_file`` (the last one per cell, in the
    spec's order); a cell without a result is an error naming the table."""
    spec = load_spec(sweeps / spec_file)
    table = sweeps / spec_file.replace(".yaml", ".results.jsonl")
    last = {r["cell"]: r for r in read_table(table) if "error" not in r}
    missing = [c for c in spec.cells if c.hash not in last]
    if missing:
        raise ValueError(
            f"{table}: {len(missing)} of {len(spec.cells)} cells of {spec_file} "
            f"have no result (first: {missing[0].hash}, {missing[0].command()}); "
            f"run `sloserve sweep {sweeps / spec_file}`"
        )
    return [last[c.hash] for c in spec.cells]


def _load(inp: Inputs, name: str) -> Any:
    return json.loads((inp.scripts / f"{name}.json").read_text())


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------- Sarathi-Serve

SARATHI_CLAIMS = {
    # (trace, tbt): (paper's figure in words, ratio the text gives or None)
    ("sharegpt", 0.1): (
        "Mistral-7B, 1×A100, strict P99 TBT 0.1 s: up to 2.6× vLLM (abstract); "
        "3.5× at 100 ms (§5.2, Fig. 12)",
        2.6,
    ),
    ("sharegpt", 0.5): (
        "relaxed SLO: gain smaller than strict; 1.65× vLLM at 1 s for Yi-34B "
        "(§5.2); Mistral-7B's relaxed bars only in Fig. 10a",
        1.65,
    ),
    ("arxiv", 0.1): (
        "arxiv_summarization, strict: Sarathi > vLLM in every case (Fig. 10b, "
        "values only in the plot)",
        None,
    ),
    ("arxiv", 0.5): ("arxiv_summarization, relaxed: Sarathi > vLLM (Fig. 10b)", None),
}


ARXIV_NOTE = (
    "; our arxiv stats are Vidur's ≤ 4,096-token filter (median prompt 2,730, "
    "output 167) where the paper's median prompt is 7,059"
)


def _limit(r: dict[str, Any], tbt: float) -> str:
    f = r["first_fail"]
    if f is None:
        return "never failed"
    bad = []
    if f["tbt_token_p99"] is not None and f["tbt_token_p99"] > tbt:
        bad.append(f"P99 TBT {f['tbt_token_p99'] * 1e3:.1f} ms")
    if "sched_delay_p50_all" in f:  # the core's tail (issue 38): drops count
        delay = f["sched_delay_p50_all"]
        if delay is None:
            bad.append("median sched. delay infinite (half dropped or never scheduled)")
        elif delay > TAIL_SCHED_DELAY:
            bad.append(f"median sched. delay {delay:.1f} s")
        if f["drop_share"] is not None and f["drop_share"] > MAX_DROP_SHARE:
            bad.append(f"{f['drop_share']:.1%} dropped")
    elif f["sched_delay_p50"] is not None and f["sched_delay_p50"] > 2.0:
        bad.append(f"median sched. delay {f['sched_delay_p50']:.1f} s")
    return f"fails at {f['qps']:.2f} req/s on " + (" and ".join(bad) or "?")


def _first_fail(result: dict[str, Any]) -> dict[str, Any] | None:
    return next((p for p in result["probes"] if not p["meets"]), None)


def sarathi_section(inp: Inputs) -> tuple[list[Row], list[str]]:
    """Sarathi-Serve §5.1-5.2: tail capacity of sarathi over vllm (and orca)."""
    cells = spec_rows(inp.sweeps, SPECS["sarathi"])
    by = {
        f"{c['config']['trace']}/tbt{c['config']['tbt_slo']}/{c['config']['policy']}": {
            "capacity": c["result"]["capacity_qps"],
            "first_fail": _first_fail(c["result"]),
        }
        for c in cells
    }
    data = {"num_requests": cells[0]["config"]["num_requests"]}
    rows: list[Row] = []
    labels, caps, colors = [], [], []
    for (trace, tbt), (paper, pratio) in SARATHI_CLAIMS.items():
        v, s = by.get(f"{trace}/tbt{tbt}/vllm"), by.get(f"{trace}/tbt{tbt}/sarathi")
        if v is None or s is None:
            continue
        o = by.get(f"{trace}/tbt{tbt}/orca")
        r = ratio(s["capacity"], v["capacity"])
        ours = (
            f"sarathi {fmt(s['capacity'])} vs vllm {fmt(v['capacity'])} req/s = "
            f"**{fmt(r)}×**" + (f"; orca {fmt(o['capacity'])}" if o else "")
        )
        why = f"vllm {_limit(v, tbt)}; sarathi {_limit(s, tbt)}"
        rows.append(
            Row(
                f"capacity vs vLLM, {trace}, P99 TBT ≤ {tbt} s "
                f"(budget {512 if tbt < 0.25 else 2048})",
                paper,
                ours,
                f"llama-3-8b/A100 simulated (paper: Mistral-7B), "
                f"{data['num_requests']} req/probe" + ARXIV_NOTE * (trace == "arxiv"),
                verdict(pratio, r),
                why,
            )
        )
        for p, rr, color in (("vllm", v, "C0"), ("sarathi", s, "C1"), ("orca", o, "C2")):
            if rr is not None:
                labels.append(f"{trace}\nTBT {tbt}\n{p}")
                caps.append(rr["capacity"] or 0.0)
                colors.append(color)
    if inp.plots is not None:
        _sarathi_plot(inp.plots, labels, caps, colors)
    return rows, [f"{PLOTS}/sarathi_capacity.png"]


def _sarathi_plot(out: Path, labels: list[str], caps: list[float], colors: list[str]) -> None:
    plt = _plt()
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.bar(range(len(caps)), caps, color=colors)
    ax.set_xticks(range(len(caps)), labels, fontsize=7)
    ax.set_ylabel("capacity (req/s)")
    ax.set_title("Sarathi-Serve §5.1: capacity under P99 TBT and median delay ≤ 2 s")
    fig.tight_layout()
    fig.savefig(out / "sarathi_capacity.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- Ascendra Fig. 9

ASCENDRA_QPS = (6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0)
ASCENDRA_SETUPS = {  # name: (policy, instances, hp)
    "ascendra 2L1H": ("ascendra", 3, 1),
    "vllm ×3": ("vllm", 3, 0),
    "sarathi ×3": ("sarathi", 3, 0),
}


def ascendra_section(inp: Inputs) -> tuple[list[Row], list[str]]:
    """Ascendra Fig. 9 (2L1H vs vllm and sarathi on 3 instances), §8.4 and §8.6."""
    cells = spec_rows(inp.sweeps, SPECS["ascendra"])
    cap = {
        c["labels"]["setup"]: c["result"]["capacity_qps"] for c in cells if c["kind"] == "capacity"
    }
    data: dict[str, Any] = {
        "num_requests": cells[0]["config"]["num_requests"],
        "sweep": [
            {"setup": c["labels"]["setup"], "qps": c["config"]["qps"], **c["result"]}
            for c in cells
            if c["kind"] == "simulate"
        ],
    }
    a, v, s = cap["ascendra 2L1H"], cap["vllm ×3"], cap["sarathi ×3"]
    setup = (
        f"llama-3-8b/A100 ×3 simulated (paper: Mistral-7B), ShareGPT, TTFT 1 s, mean TBT "
        f"0.15 s, {data['num_requests']} req/probe"
    )
    sweep = {(r["setup"], r["qps"]): r for r in data["sweep"]}
    over = [q for q in ASCENDRA_QPS if (sweep[("vllm ×3", q)]["goodput_share"] or 0) < 0.9]
    above = [
        ratio(sweep[("ascendra 2L1H", q)]["goodput_share"], sweep[(b, q)]["goodput_share"])
        for q in over
        for b in ("vllm ×3", "sarathi ×3")
    ]
    above_r = [x for x in above if x is not None]

    def at(q: float) -> str:
        return ", ".join(f"{n} {fmt(sweep[(n, q)]['goodput_share'])}" for n in ASCENDRA_SETUPS) + (
            f" ({sweep[('ascendra 2L1H', q)].get('offloads')} offloads)"
        )

    knee = min(over) if over else ASCENDRA_QPS[-1]
    why = f"goodput share at {knee:g} req/s: {at(knee)}"
    rows = [
        Row(
            "goodput capacity (≥ 90 % of requests meet TTFT and mean TBT) vs vLLM ×3",
            "+19.1 % (Mistral-7B, ShareGPT, Fig. 9)",
            f"{fmt(a)} vs {fmt(v)} req/s = **{fmt(ratio(a, v))}×**",
            setup,
            verdict(1.191, ratio(a, v)),
            why,
        ),
        Row(
            "goodput capacity vs Sarathi ×3",
            "+17.4 % (Fig. 9)",
            f"{fmt(a)} vs {fmt(s)} req/s = **{fmt(ratio(a, s))}×**",
            setup,
            verdict(1.174, ratio(a, s)),
            why,
        ),
        Row(
            "above capacity Ascendra keeps more goodput than both baselines",
            '"continues to outperform both baselines even under extreme load" (§8.2, Fig. 9)',
            f"ascendra / baseline goodput share at {', '.join(f'{q:g}' for q in over)} req/s: "
            f"{_range(above_r)}",
            setup,
            verdict(None, _median(above_r)),
            f"at {ASCENDRA_QPS[-1]:g} req/s: {at(ASCENDRA_QPS[-1])}",
        ),
    ]
    if inp.plots is not None:
        _ascendra_plot(inp.plots, data["sweep"])
    rows += ascendra_script_rows(inp)
    return rows, [f"{PLOTS}/ascendra_fig9.png"]


def _ascendra_plot(out: Path, sweep_rows: list[dict[str, Any]]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for name in ASCENDRA_SETUPS:
        pts = [(r["qps"], r["goodput_share"]) for r in sweep_rows if r["setup"] == name]
        ax.plot([q for q, _ in pts], [g for _, g in pts], marker="o", label=name)
    ax.axhline(0.9, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("arrival rate (req/s)")
    ax.set_ylabel("goodput share")
    ax.set_title("Ascendra Fig. 9 (top left), simulated")
    ax.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "ascendra_fig9.png", dpi=110)
    plt.close(fig)


def ascendra_script_rows(inp: Inputs) -> list[Row]:
    """§8.4 (value functions) and §8.6 (overload with drops) from their own scripts."""
    rows: list[Row] = []
    if (inp.scripts / "ascendra_value_functions.json").exists():
        d = _load(inp, "ascendra_value_functions")
        g, rates = d["ours"]["goodput_share"], d["ours"]["rates"]
        cells = "; ".join(
            f"{q:g}/s: EDF {e:.3f}, FCFS {f:.3f}, SJF {j:.3f}"
            for q, e, f, j in zip(rates, g["edf"], g["fcfs"], g["sjf"])
        )
        wins = len(d["ours"]["edf_beats_sjf_at"])
        rows.append(
            Row(
                "EDF vs SJF (and FCFS) reorder policy on LP, goodput share",
                f"{d['paper']['claim']} ({d['paper']['source']})",
                cells,
                f"2L1H, {d['setup']['num_requests']} ShareGPT requests per rate",
                "reproduced" if wins == len(rates) else "partly" if wins else "not",
                "slack-EDF (arrival + TTFT − predicted prefill) serves long prompts "
                "first and offloads more; most offloads reach the HP at their deadline "
                "(docs/ascendra.md)",
            )
        )
    if (inp.scripts / "ascendra_overload.json").exists():
        d = _load(inp, "ascendra_overload")
        o, st = d["ours"], d["setup"]
        r = o["served_under_slo_ratio_vs_best_baseline"]
        rows.append(
            Row(
                "overload: requests served under SLO vs the best baseline, late requests dropped",
                f"{d['paper']['served_under_slo_ratio']}× ({d['paper']['source']})",
                f"**{r:.2f}×** (vs vLLM ×3 {o['served_under_slo_ratio_vs_vllmx3']:.2f}×, "
                f"vs Sarathi ×3 {o['served_under_slo_ratio_vs_sarathix3']:.2f}×)",
                f"{st['qps']:g} req/s for {st['num_requests']} requests (paper: 10 min "
                "slightly above capacity); every system drops requests waiting past "
                "their TTFT deadline",
                verdict(d["paper"]["served_under_slo_ratio"], r),
                "Ascendra's offloads queue on the single HP and mostly arrive at their "
                "TTFT deadline (docs/ascendra.md)",
            )
        )
    return rows


# ---------------------------------------------------------------- AccelGen, BestServe

ACCELGEN_BASELINES = ("vllm", "sarathi", "orca", "oracle")


def _range(xs: list[float]) -> str:
    return "—" if not xs else f"{min(xs):.2f}–{max(xs):.2f}×"


def _median(xs: list[float]) -> float | None:
    return None if not xs else sorted(xs)[len(xs) // 2]


ACCELGEN_METRICS = (  # key, label, paper claim key, the claim's low end, higher is better
    ("goodput_share", "goodput", "goodput_x", 1.43, True),
    ("throughput_tok_s", "throughput (tok/s)", "throughput_x", 1.42, True),
    ("token_slo_attainment", "per-token SLO attainment", "slo_attainment", 1.37, True),
    ("jct_p50", "median JCT (ratio baseline/AccelGen)", "jct_x", 1.61, False),
)
ACCELGEN_WHY = {
    "goodput_share": "half of the hetero TTFT SLOs (group prefill latency × U[0.5, 1.5], §3) "
    "are below an unloaded whole-prompt prefill: vLLM prefills whole prompts, "
    "every chunking policy lands the first token a few chunks later "
    "(docs/accelgen.md)",
    "throughput_tok_s": "below saturation every policy serves the offered load; the paper's "
    "gains come from OPT-13B/175B iterations and memory limits we do not "
    "have (Orca's batch of 8 is the exception)",
    "token_slo_attainment": "every stall-free policy already meets ≥ 0.99 of token gaps on "
    "20–110 ms iterations; only vLLM's prefill stalls leave room",
    "jct_p50": "JCT follows queueing; under KV pressure AccelGen's decode-first batching "
    "frees memory sooner",
}


def accelgen_section(inp: Inputs) -> tuple[list[Row], list[str]]:
    """AccelGen §6 (Fig. 11, 14): ratios over every rate run, per regime and baseline.

    Read from ``accelgen_compare.json`` (``infra/experiments/accelgen_compare.py``). A claim
    given as a range ("1.43–13.71×") is judged against its low end with our
    median ratio: the paper says every setup gains at least that much.
    """
    data = _load(inp, "accelgen_compare")
    st, paper = data["setup"], data["paper"]
    setup = (
        f"{st['model']}/{st['gpu']} simulated (paper: OPT-13B/175B); mix "
        + ", ".join(f"{v:.0%} {t}" for t, v in st["mix"].items())
        + f" (paper: 35 % BookCorpus); {st['num_requests']} requests; S_pf = "
        f"{st['sarathi_token_budget']}"
    )
    by: dict[tuple[str, float], dict[str, dict[str, Any]]] = {}
    for r in data["rows"]:
        by.setdefault((r["regime"], r["qps"]), {})[r["policy"]] = r
    rows: list[Row] = []
    for regime in ("hetero", "kv-pressure"):
        runs = [v for (rg, _), v in sorted(by.items()) if rg == regime]
        where = setup + ("; KV cache 12 GB" if "kv" in regime else "; KV from GPU memory")
        for key, label, pkey, plow, higher in ACCELGEN_METRICS:
            ptext = paper[pkey]
            cells, verdicts = [], []
            for base in ("vllm", "sarathi", "orca"):
                pairs = [(p.get("accelgen", {}).get(key), p.get(base, {}).get(key)) for p in runs]
                rs = [
                    x for a, b in pairs if (x := ratio(a, b) if higher else ratio(b, a)) is not None
                ]
                med = _median(rs)
                cells.append(f"vs {base} {_range(rs)} (median {fmt(med)}×)")
                verdicts.append(f"{base}: {verdict(plow, med)}")
            rows.append(
                Row(
                    f"{label}, {regime}, {len(runs)} rates",
                    ptext,
                    "; ".join(cells),
                    where,
                    "; ".join(verdicts),
                    ACCELGEN_WHY[key],
                )
            )
        rs = [
            x
            for pols in runs
            if (
                x := ratio(
                    pols.get("oracle", {}).get("goodput_share"),
                    pols.get("accelgen", {}).get("goodput_share"),
                )
            )
            is not None
        ]
        rows.append(
            Row(
                f"oracle / AccelGen goodput, {regime}",
                paper["oracle"],
                _range(rs),
                where,
                "n/a (baseline check)",
                "our oracle is SRPT on true output lengths, not the paper's offline "
                "goodput search: no upper bound",
            )
        )
    return rows, []


def error_verdict(paper_pct: float, ours_pct: float | None) -> str:
    """Error claims: reproduced when ours ≤ the paper's, partly when ≤ 2× it, else not."""
    if ours_pct is None:
        return "not measured"
    return (
        "reproduced" if ours_pct <= paper_pct else "partly" if ours_pct <= 2 * paper_pct else "not"
    )


def bestserve_section(inp: Inputs) -> tuple[list[Row], list[str]]:
    """BestServe §5 (Table 3, OP1–OP4): the fast estimator against the accurate simulator.

    The paper's error is against vLLM-Ascend on real 910B3s; ours is fast vs accurate mode
    with the A100 constants calibrated on our profiles, both under Algorithm 8's bound
    (which caps nearly every answer) and with the bound extended (``--extend-upper``).
    """
    d = _load(inp, "bestserve_ops")
    rows = []
    for r in d["reproduction"]:
        paper_pct = float(r["paper"].split("%")[0])
        best_fast, best_acc = r["best_fast_vs_accurate"]
        rows.append(
            Row(
                r["claim"].replace("|error|", "absolute error"),
                r["paper"],
                f"**{r['ours_extended_bound']:.1f} %** with λ_u extended; "
                f"{r['ours_paper_bound']:.1f} % under λ_u = 1.2/T_min; best strategy "
                f"fast {best_fast} / accurate {best_acc} over "
                f"{', '.join(r['strategies'])}",
                r["setup"] + f"; {d['setup']['accurate_requests']} requests per accurate run",
                error_verdict(paper_pct, r["ours_extended_bound"]),
                "λ_u caps every strategy at nearly the same rate, so the paper-bound "
                "error says little; with it extended the fast mode's closed-form "
                "queueing overestimates collocated goodput against the accurate mode; "
                "ours is simulator vs simulator, the paper's is vs real runs "
                "(docs/bestserve.md)",
            )
        )
    return rows, []


# ---------------------------------------------------------------- document

TITLES = {
    "sarathi": "Sarathi-Serve (OSDI '24)",
    "ascendra": "Ascendra",
    "accelgen": "AccelGen",
    "bestserve": "BestServe",
}
RUNNERS = {
    "sarathi": sarathi_section,
    "ascendra": ascendra_section,
    "accelgen": accelgen_section,
    "bestserve": bestserve_section,
}
SCRIPT_SECTIONS = {"accelgen": "accelgen_compare", "bestserve": "bestserve_ops"}
COMMAND = "sloserve sweep report infra/sweeps --template reproduction --out docs"


def render(sections: dict[str, tuple[list[Row], list[str]]]) -> str:
    """The document above the discussion marker."""
    out = [
        "# Reproducing the papers' headline claims",
        "",
        f"Generated by `{COMMAND}` from the sweep specs "
        "`infra/sweeps/reproduction_{sarathi,ascendra}.yaml` "
        "and their tables (`*.results.jsonl` beside them); the AccelGen, BestServe and "
        "Ascendra §8.4/§8.6 rows from the JSON their tools in `infra/experiments/` write "
        "to `docs/results/reproduction/`. "
        "Every figure is simulated: batch times come from the real-GPU ground truth, "
        "the policies see only their own perf model.",
        "",
        "Verdict rule (the same for every row): **reproduced** when our gain is at "
        "least half the paper's (ratio ≥ 1 + (paper − 1)/2), **partly** when it is in "
        "the paper's direction but smaller, **not** when there is no gain. Claims whose "
        "number is only in a plot are judged on direction.",
        "",
    ]
    for key in SECTIONS:
        if key not in sections:
            continue
        rows, plots = sections[key]
        out += [f"## {TITLES[key]}", ""]
        if not rows:
            out += ["_No result: this section's experiment did not run._", ""]
        else:
            out += ["| claim | paper | ours | setup | verdict | why |", "|---|---|---|---|---|---|"]
            out += [
                f"| {r.claim} | {r.paper} | {r.ours} | {r.setup} | **{r.verdict}** | {r.why} |"
                for r in rows
            ]
            out.append("")
        out += [f"![{key}]({p})" for p in plots] + ([""] if plots else [])
    return "\n".join(out)


def build(sweeps: Path, out: Path, plots: bool = True) -> str:
    """The whole document: the tables from ``sweeps``' specs and ``out``'s tools' JSON,
    then the discussion kept from ``out/reproduction.md`` (drawing the plots into
    ``out/reproduction/`` unless ``plots`` is False)."""
    if not sweeps.is_dir():
        raise ValueError(
            f"{sweeps}: not a folder (the folder of the reproduction specs, e.g. infra/sweeps)"
        )
    inp = Inputs(sweeps=sweeps, scripts=out / SCRIPT_RESULTS, plots=out / PLOTS if plots else None)
    sections = {}
    for key in SECTIONS:
        tool = SCRIPT_SECTIONS.get(key)
        if tool is not None and not (inp.scripts / f"{tool}.json").exists():
            continue  # that tool has not run: the section is left out
        sections[key] = RUNNERS[key](inp)
    doc = out / "reproduction.md"
    kept = ""
    if doc.exists():
        text = doc.read_text()
        if DISCUSSION in text:
            kept = text.split(DISCUSSION, 1)[1]
    return render(sections) + "\n" + DISCUSSION + kept


def write_reproduction(sweeps: Path, out: Path) -> Path:
    """``build`` written to ``out/reproduction.md``; returns its path."""
    text = build(sweeps, out)
    path = out / "reproduction.md"
    path.write_text(text)
    return path
