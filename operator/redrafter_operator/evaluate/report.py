"""The evaluation report: JSON (the data), PNG plots (matplotlib, Agg) and a markdown + HTML summary.

:func:`build_report` assembles the JSON document from a sweep (pure); :func:`figures`,
:func:`markdown` and :func:`html` render it; :func:`write_report` lays the files out. The HTML embeds
the PNGs as data URIs so one file is the whole report. ``label`` (e.g. "simulated engine on CPU")
is carried into every title, so figures from a simulator can never pass for measurements of a GPU.
"""

from __future__ import annotations

import base64
import html as htmllib
import io
import json
import time
from pathlib import Path
from typing import Any

from .stats import Crossover, LevelStats, crossover, speedups

REPORT_KIND = "redrafter-evaluation"
REPORT_VERSION = 1
FIGURES = ("speedup", "throughput", "latency", "acceptance")
COLORS = {"redrafter": "#d62728", "base": "#1f77b4"}


def build_report(
    levels: dict[str, list[LevelStats]],
    config: dict[str, Any],
    *,
    label: str | None = None,
    generated_at: float | None = None,
) -> dict[str, Any]:
    """The JSON document: config, per-level stats per variant, speedup, crossover, acceptance."""
    sp = speedups(levels.get("redrafter", []), levels.get("base", [])) if {"redrafter", "base"} <= set(levels) else []
    cross = crossover(sp) if sp else Crossover("no_data", None)
    hist: dict[tuple[float, float], int] = {}
    for lv in levels.get("redrafter", []):
        for b in lv.acceptance.histogram if lv.acceptance else []:
            hist[(b["lo"], b["hi"])] = hist.get((b["lo"], b["hi"]), 0) + b["count"]
    drafted = sum(lv.acceptance.draft_tokens for lv in levels.get("redrafter", []) if lv.acceptance)
    accepted = sum(lv.acceptance.accepted_draft_tokens for lv in levels.get("redrafter", []) if lv.acceptance)
    return {
        "kind": REPORT_KIND,
        "version": REPORT_VERSION,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(generated_at or time.time())),
        "label": label,
        "config": config,
        "levels": {v: [lv.to_dict() for lv in lvs] for v, lvs in levels.items()},
        "speedup": [{"concurrency": c, "speedup": s} for c, s in sp],
        "crossover": cross.to_dict(),
        "acceptance": {
            "pooled": accepted / drafted if drafted else None,
            "draft_tokens": drafted,
            "accepted_draft_tokens": accepted,
            "histogram": [{"lo": lo, "hi": hi, "count": n} for (lo, hi), n in sorted(hist.items())],
        },
    }


def load_levels(report: dict[str, Any]) -> dict[str, list[LevelStats]]:
    return {v: [LevelStats.from_dict(x) for x in lvs] for v, lvs in report["levels"].items()}


# ---- figures ---------------------------------------------------------------------------------------
def _title(report: dict[str, Any], text: str) -> str:
    return f"{text}\n({report['label']})" if report.get("label") else text


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def _log2_axis(ax: Any, concurrencies: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies)
    ax.set_xticklabels([str(c) for c in concurrencies])
    ax.set_xlabel("concurrent requests")
    ax.grid(True, alpha=0.3)


def figures(report: dict[str, Any]) -> dict[str, bytes]:
    """PNG bytes of each figure that has data (speedup needs both variants, acceptance ReDrafter)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = load_levels(report)
    conc = sorted({lv.concurrency for lvs in levels.values() for lv in lvs})
    out: dict[str, bytes] = {}
    if report["speedup"]:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [p["concurrency"] for p in report["speedup"]]
        ax.plot(
            xs, [p["speedup"] for p in report["speedup"]], "o-", color=COLORS["redrafter"], label="ReDrafter / base"
        )
        ax.axhline(1.0, color="grey", ls="--", lw=1)
        cross = report["crossover"]
        if cross["status"] == "crossed":
            ax.axvline(
                cross["concurrency"], color="black", ls=":", lw=1, label=f"crossover ≈ {cross['concurrency']:.1f}"
            )
        _log2_axis(ax, conc)
        ax.set_ylabel("output tokens/s speedup")
        ax.set_title(_title(report, "ReDrafter speedup over base vs concurrency"))
        ax.legend()
        out["speedup"] = _png(fig)
    if levels:
        fig, ax = plt.subplots(figsize=(6, 4))
        for v, lvs in levels.items():
            ax.plot([lv.concurrency for lv in lvs], [lv.tokens_per_s for lv in lvs], "o-", color=COLORS.get(v), label=v)
        _log2_axis(ax, conc)
        ax.set_ylabel("output tokens/s")
        ax.set_title(_title(report, "Throughput"))
        ax.legend()
        out["throughput"] = _png(fig)

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for v, lvs in levels.items():
            c = COLORS.get(v)
            a1.plot(
                [lv.concurrency for lv in lvs],
                [lv.ttft.p50 * 1e3 if lv.ttft else float("nan") for lv in lvs],
                "o-",
                color=c,
                label=f"{v} TTFT p50",
            )
            a1.plot(
                [lv.concurrency for lv in lvs],
                [lv.itl.p50 * 1e3 if lv.itl else float("nan") for lv in lvs],
                "s--",
                color=c,
                label=f"{v} inter-token p50",
            )
            a2.plot(
                [lv.concurrency for lv in lvs],
                [lv.e2e.p50 if lv.e2e else float("nan") for lv in lvs],
                "o-",
                color=c,
                label=f"{v} p50",
            )
            a2.plot(
                [lv.concurrency for lv in lvs],
                [lv.e2e.p99 if lv.e2e else float("nan") for lv in lvs],
                "^:",
                color=c,
                label=f"{v} p99",
            )
        for ax in (a1, a2):
            _log2_axis(ax, conc)
            ax.legend(fontsize=8)
        a1.set_ylabel("ms")
        a1.set_title(_title(report, "Time to first token / inter-token latency"))
        a2.set_ylabel("s")
        a2.set_title(_title(report, "End-to-end latency"))
        out["latency"] = _png(fig)
    hist = report["acceptance"]["histogram"]
    if hist and any(b["count"] for b in hist):
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar(
            [b["lo"] for b in hist],
            [b["count"] for b in hist],
            width=[b["hi"] - b["lo"] for b in hist],
            align="edge",
            color=COLORS["redrafter"],
            edgecolor="white",
        )
        if report["acceptance"]["pooled"] is not None:
            ax.axvline(
                report["acceptance"]["pooled"],
                color="black",
                ls=":",
                label=f"pooled {report['acceptance']['pooled']:.2f}",
            )
            ax.legend()
        ax.set_xlabel("per-request acceptance rate (accepted / drafted)")
        ax.set_ylabel("requests")
        ax.set_title(_title(report, "ReDrafter acceptance distribution"))
        out["acceptance"] = _png(fig)
    return out


# ---- summaries -------------------------------------------------------------------------------------
def _fmt(x: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if x is None else f"{x * scale:.{digits}f}"


def _crossover_text(cross: dict[str, Any]) -> str:
    if cross["status"] == "crossed":
        return f"ReDrafter stops beating base at about **{cross['concurrency']:.2f}** concurrent requests."
    if cross["status"] == "never_faster":
        return "ReDrafter was slower than base at every concurrency measured (crossover 0)."
    if cross["status"] == "always_faster":
        return f"ReDrafter beat base at every concurrency measured (crossover above {cross['at_least']:g})."
    return "No crossover: both variants are needed to compute it."


def _table(report: dict[str, Any]) -> list[str]:
    rows = [
        "| variant | concurrency | requests | errors | tokens/s | TTFT p50 (ms) | ITL p50 (ms) | "
        "e2e p50 / p99 (s) | acceptance | GPU util (%) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v, lvs in load_levels(report).items():
        for lv in lvs:
            rows.append(
                f"| {v} | {lv.concurrency} | {lv.requests} | {lv.errors} | {lv.tokens_per_s:.1f} | "
                f"{_fmt(lv.ttft.p50 if lv.ttft else None, 1e3)} | {_fmt(lv.itl.p50 if lv.itl else None, 1e3, 2)} | "
                f"{_fmt(lv.e2e.p50 if lv.e2e else None, 1, 2)} / {_fmt(lv.e2e.p99 if lv.e2e else None, 1, 2)} | "
                f"{_fmt(lv.acceptance.pooled if lv.acceptance else None, 1, 3)} | {_fmt(lv.gpu_utilization)} |"
            )
    return rows


def markdown(report: dict[str, Any], figure_files: dict[str, str] | None = None) -> str:
    """The summary as markdown; ``figure_files`` maps figure name -> relative path (or data URI)."""
    title = "ReDrafter evaluation" + (f" — {report['label']}" if report.get("label") else "")
    cfg = report["config"]
    lines = [f"# {title}", "", f"Generated {report['generated_at']}.", ""]
    if report.get("label"):
        lines += [f"> **{report['label']}** — every figure below comes from this source.", ""]
    lines += [
        "## Result",
        "",
        _crossover_text(report["crossover"]),
        "",
        "| concurrency | speedup (ReDrafter / base tokens/s) |",
        "|---:|---:|",
        *[f"| {p['concurrency']} | {p['speedup']:.2f}× |" for p in report["speedup"]],
        "",
    ]
    acc = report["acceptance"]
    if acc["pooled"] is not None:
        lines += [
            f"Acceptance (pooled over all ReDrafter requests): **{acc['pooled']:.3f}** "
            f"({acc['accepted_draft_tokens']} of {acc['draft_tokens']} draft tokens).",
            "",
        ]
    lines += ["## Per level", "", *_table(report), ""]
    for name in FIGURES:
        if figure_files and name in figure_files:
            lines += [f"![{name}]({figure_files[name]})", ""]
    lines += [
        "## Method",
        "",
        f"Closed-loop streaming load over gRPC against the `{cfg.get('model', 'ensemble')}` model; "
        f"{cfg.get('requests_per_worker')} requests per concurrent worker per level, "
        f"{cfg.get('max_tokens')} output tokens per request (fixed length: {cfg.get('fixed_length')}), "
        f"greedy: {cfg.get('greedy')}, {cfg.get('prompts')} prompts. Tokens counted by: "
        f"{cfg.get('token_counting')}. Inter-token latency spreads each chunk's gap over the tokens it "
        "carries. Speedup = output tokens/s of ReDrafter ÷ base at equal concurrency; the crossover is "
        "interpolated linearly between the last faster and the first slower level.",
        "",
        "Endpoints: " + ", ".join(f"{v} `{u}`" for v, u in cfg.get("endpoints", {}).items()),
        "",
    ]
    return "\n".join(lines)


def html(report: dict[str, Any], pngs: dict[str, bytes]) -> str:
    """A self-contained HTML page: the markdown's content with the PNGs embedded as data URIs."""
    e = htmllib.escape
    title = "ReDrafter evaluation" + (f" — {report['label']}" if report.get("label") else "")
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}.label{background:#fff3cd;padding:8px}"
        "</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f"<p>Generated {e(report['generated_at'])}.</p>",
    ]
    if report.get("label"):
        parts.append(f"<p class='label'><b>{e(report['label'])}</b> — every figure below comes from this source.</p>")
    cross = _crossover_text(report["crossover"]).replace("**", "")
    parts += ["<h2>Result</h2>", f"<p>{e(cross)}</p>", "<table><tr><th>concurrency</th><th>speedup</th></tr>"]
    parts += [f"<tr><td>{p['concurrency']}</td><td>{p['speedup']:.2f}×</td></tr>" for p in report["speedup"]]
    parts.append("</table>")
    if report["acceptance"]["pooled"] is not None:
        parts.append(f"<p>Acceptance (pooled): <b>{report['acceptance']['pooled']:.3f}</b></p>")
    rows = _table(report)
    parts.append("<h2>Per level</h2><table>")
    parts.append("<tr>" + "".join(f"<th>{e(c.strip())}</th>" for c in rows[0].strip("|").split("|")) + "</tr>")
    for row in rows[2:]:
        parts.append("<tr>" + "".join(f"<td>{e(c.strip())}</td>" for c in row.strip("|").split("|")) + "</tr>")
    parts.append("</table>")
    for name in FIGURES:
        if name in pngs:
            data = base64.b64encode(pngs[name]).decode("ascii")
            parts.append(f"<h3>{e(name)}</h3><img alt='{e(name)}' src='data:image/png;base64,{data}'>")
    parts.append(f"<h2>Data</h2><pre>{e(json.dumps(report['config'], indent=2))}</pre></body></html>")
    return "\n".join(parts)


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """report.json, <figure>.png, report.md (linking the PNGs) and report.html (self-contained)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {"json": out / "report.json"}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    pngs = figures(report)
    for name, data in pngs.items():
        paths[name] = out / f"{name}.png"
        paths[name].write_bytes(data)
    paths["markdown"] = out / "report.md"
    paths["markdown"].write_text(markdown(report, {n: f"{n}.png" for n in pngs}), encoding="utf-8")
    paths["html"] = out / "report.html"
    paths["html"].write_text(html(report, pngs), encoding="utf-8")
    return paths
