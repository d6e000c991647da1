"""What the demo shows: a live table while it runs (rich), and the summary at the end.

Every figure comes from the resource's status (written by the operator) or from the load generator;
on a non-terminal stdout (CI, tests) the live table becomes a status line every few seconds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from engine_jobs.contract import ACCEPTANCE_HEADER

from .scenarios import Scenario, Stage, StageResult, describe, lookup
from .traffic import RoutedLoadGenerator, TrafficStats

PLAIN_EVERY_S = 5.0


def _num(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


class RunState(Protocol):
    """What the view reads of a running demo (demo.DemoRun): the view never drives the run."""

    obj: dict[str, Any] | None  # the resource as last read
    stats: TrafficStats
    loadgen: RoutedLoadGenerator | None
    current: Stage | None
    results: list[StageResult]

    def elapsed(self) -> float: ...


class DemoView:
    def __init__(self, scenario: Scenario, run: RunState) -> None:
        self.scenario = scenario
        self.run = run
        self.console = Console()
        if not self.console.is_terminal:  # CI logs and test captures: wide enough for the summary tables
            self.console = Console(width=160)
        self._live: Live | None = None
        self._notes: list[str] = []
        self._last_plain = 0.0

    # -------------------------------------------------------------------------- events from the run
    def note(self, text: str) -> None:
        line = f"[{self.run.elapsed():6.1f}s] {text}"
        self._notes = (self._notes + [line])[-4:]
        if self._live is None:
            self.console.print(line, highlight=False)

    def stage_done(self, res: StageResult) -> None:
        mark = "✓" if res.happened else "✗"
        seen = ", ".join(f"{v!r}" for v in res.observed.values())
        detail = f"{res.condition} (observed {seen})" if res.happened else res.failure
        self.note(f"{mark} stage {res.name} in {res.duration_s:.1f}s: {detail}")

    def update(self) -> None:
        if self._live is not None:
            self._live.update(self.render())
        elif time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = time.monotonic()
            self.console.print(self.plain_line(), highlight=False)

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        if not self.console.is_terminal:
            yield
            return
        with Live(self.render(), console=self.console, refresh_per_second=4, transient=False) as live:
            self._live = live
            try:
                yield
            finally:
                live.update(self.render())
                self._live = None

    # -------------------------------------------------------------------------- rendering
    def figures(self) -> dict[str, str]:
        obj = self.run.obj or {}
        spec = lookup(obj, "status.speculation") or {}
        window = self.run.stats.window()
        gen = self.run.loadgen
        return {
            "phase": str(lookup(obj, "status.phase") or "-"),
            "engine": str(lookup(obj, "status.activeEngine") or "-"),
            "replicas": f"{_num(lookup(obj, 'status.serving.readyReplicas'), '{}')}/"
            f"{_num(lookup(obj, 'status.serving.replicas'), '{}')}",
            "acceptance": _num(spec.get("acceptanceRate")),
            "client_acceptance": _num(window["acceptance_rate"]),
            "tokens_s": _num(window["tokens_per_s"], "{:.0f}"),
            "concurrency": str(gen.concurrency if gen else 0),
            "decision": f"{spec.get('decision') or '-'}: {spec.get('reason') or ''}".strip(),
            "pods": ", ".join(f"{p.split('-')[-1]}={n}" for p, n in sorted(window["by_pod"].items())) or "-",
            "drafter": drafter_line(lookup(obj, "status.drafter")),
        }

    def plain_line(self) -> str:
        f = self.figures()
        stage = self.run.current.name if self.run.current else "-"
        return (
            f"[{self.run.elapsed():6.1f}s] {stage:<10} phase={f['phase']} engine={f['engine']} "
            f"replicas={f['replicas']} acceptance={f['acceptance']} tok/s={f['tokens_s']} "
            f"conc={f['concurrency']} decision={f['decision'][:90]}"
            + (f" drafter={f['drafter']}" if f["drafter"] else "")
        )

    def render(self) -> Group:
        stages = Table(
            title=f"redrafter-sim demo — scenario {self.scenario.name}  ({self.run.elapsed():.0f}s)",
            expand=True,
            show_lines=False,
        )
        for col in ("", "stage", "until", "took"):
            stages.add_column(col)
        done = {r.name: r for r in self.run.results}
        for s in self.scenario.stages:
            r = done.get(s.name)
            if r is not None:
                mark, took = ("[green]✓[/]" if r.happened else "[red]✗[/]"), f"{r.duration_s:.1f}s"
            elif self.run.current is s:
                mark, took = "[yellow]▶[/]", "…"
            else:
                mark, took = "·", ""
            stages.add_row(mark, f"{s.name}: {s.description}", describe(s.until), took)
        f = self.figures()
        live = Table(expand=True)
        for col in (
            "phase",
            "active engine",
            "replicas (ready/desired)",
            "acceptance (operator / clients)",
            "tokens/s",
            "concurrency",
            "last decision",
        ):
            live.add_column(col)
        live.add_row(
            f["phase"],
            f["engine"],
            f["replicas"],
            f"{f['acceptance']} / {f['client_acceptance']}",
            f["tokens_s"],
            f["concurrency"],
            Text(f["decision"][:120]),
        )
        return Group(
            stages,
            live,
            Text(f"requests by pod (last 4 s): {f['pods']}", style="dim"),
            *([Text(f"drafter: {f['drafter']}")] if f["drafter"] else []),
            Text("\n".join(self._notes), style="dim"),
        )


def drafter_line(drafter: Any) -> str:
    """status.drafter in one line: its state, the training's progress, then what the trained head accepts."""
    if not isinstance(drafter, dict):
        return ""
    parts = [str(drafter.get("state", "-"))]
    if drafter.get("phase") and drafter.get("state") == "Training":
        parts.append(str(drafter["phase"]))
    if drafter.get("step") is not None:
        parts.append(f"step {drafter['step']}/{drafter.get('totalSteps', '?')}")
    if drafter.get("loss") is not None:
        parts.append(f"loss {_num(drafter['loss'])}")
    if drafter.get("heldOutAcceptance") is not None:
        parts.append(
            f"held-out acceptance {_num(drafter['heldOutAcceptance'])} "
            f"(untrained {_num(drafter.get('untrainedAcceptance'))})"
        )
    return ", ".join(parts)


def describe_chat(chat: dict[str, Any]) -> str:
    """One line on the demo's chat completion (what it got, and the speculation behind it)."""
    where = f"POST /v1/chat/completions via Service {chat.get('service')}"
    if chat.get("error"):
        return f"{where}: FAILED ({chat['error']})"
    rate = chat.get("acceptance_rate")
    spec = f"{ACCEPTANCE_HEADER}: {rate:.2f}" if rate is not None else "no speculation (base engine)"
    return (
        f"{where} (pod {chat.get('pod')}), model {chat.get('model')!r}: {chat.get('content')!r} "
        f"[{chat['usage']['completion_tokens']} tokens, {chat.get('finish_reason')}; {spec}]"
    )


def render_summary(summary: dict[str, Any], console: Console) -> None:
    """The timeline, the operator's decisions and why, and the verdict (from the summary dict)."""
    ok = summary["ok"]
    t = Table(title=f"Timeline — scenario {summary['scenario']} ({summary['wall_s']}s)", expand=False)
    for col in (
        "#",
        "stage",
        "at",
        "took",
        "happened",
        "condition (observed)",
        "operator Events in the stage",
        "operator at the end of the stage",
    ):
        t.add_column(col)
    for i, s in enumerate(summary["stages"], 1):
        spec = s.get("speculation") or {}
        serving = s.get("replicas") or {}
        said = (
            f"{serving.get('readyReplicas', '-')}/{serving.get('replicas', '-')} replicas; "
            f"acceptance {_num(spec.get('acceptanceRate'))}; {spec.get('decision') or '-'}: {spec.get('reason') or ''}"
        )
        seen = ", ".join(f"{v!r}" for v in (s.get("observed") or {}).values())
        cond = f"{s['condition']} ({seen})" if s["happened"] else s["failure"]
        reasons = list(dict.fromkeys(e["reason"] for e in s.get("decisions") or []))
        t.add_row(
            str(i),
            s["name"],
            f"{s['started_s']:.1f}s",
            f"{s['duration_s']:.1f}s",
            "[green]yes[/]" if s["happened"] else "[red]NO[/]",
            cond,
            ", ".join(reasons) or "-",
            said,
        )
    for name in summary["not_reached"]:
        t.add_row("", name, "", "", "[red]not reached[/]", "", "", "")
    console.print(t)

    h = Table(title="Engine switches (status.history)")
    for col in ("time", "from", "to", "reason"):
        h.add_column(col)
    for e in summary["history"]:
        h.add_row(str(e.get("time", "")), str(e.get("from", "")), str(e.get("to", "")), str(e.get("reason", "")))
    console.print(h)

    ev = Table(title="Events on the resource (what the operator decided and why)")
    for col in ("time", "type", "reason", "message"):
        ev.add_column(col)
    for e in summary["events"]:
        ev.add_row(str(e["time"]), e["type"], e["reason"], Text(str(e["message"])[:160]))
    console.print(ev)

    fs = summary["final_status"]
    spec = fs.get("speculation") or {}
    tr = summary["traffic"]
    console.print(
        f"final: phase={fs.get('phase')} activeEngine={fs.get('activeEngine')} "
        f"serving={fs.get('serving')} speculation.decision={spec.get('decision')} "
        f"({spec.get('reason')})",
        highlight=False,
    )
    console.print(
        f"traffic: {tr['requests']} requests, {tr['tokens']} tokens, {tr['errors']} errors"
        + (f" (last: {tr['last_error'][:120]})" if tr["errors"] else ""),
        highlight=False,
    )
    if summary.get("openai_chat"):
        console.print("OpenAI API: " + describe_chat(summary["openai_chat"]), highlight=False)
    happened = sum(1 for s in summary["stages"] if s["happened"])
    total = len(summary["stages"]) + len(summary["not_reached"])
    verdict = "[green]every stage happened[/]" if ok else f"[red]{happened}/{total} stages happened[/]"
    console.print(f"RESULT: {verdict}")
    if not ok and summary.get("operator_log_tail"):
        console.print("operator log (tail):", style="dim")
        console.print(Text(summary["operator_log_tail"], style="dim"))
