"""The chart's dashboard and alert rules ask only for what the project exports, and the rules behave.

Metric and label names come from the exporters themselves: the operator's registry (an
``OperatorMetrics`` instance), the metering model's and Triton's names in ``engine_jobs.contract``
(the one spelling both the metering model and the readers use), and the scrape's target labels.
Queries are parsed with ``promql-parser`` (a PromQL parser, not a regex). ``promtool`` (Debian's
``prometheus`` package, installed by .ci/run) checks the rules file and runs its unit tests.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import promql_parser as pp
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from engine_jobs import contract as c
from redrafter_operator.controller.metrics import OperatorMetrics
from redrafter_operator.metrics.prometheus import TARGET_LABELS
from redrafter_sim import prometheus

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = prometheus.DASHBOARD
ALERTS = prometheus.ALERT_RULES
ALERT_TESTS = ROOT / "tests" / "alerts" / "alerts_test.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/redrafter/redrafter-operator/blob/main/docs/runbook.md#"
#: Prometheus' own series and target labels (every scraped series has job and instance)
PROMETHEUS_LABELS = {"job", "instance"}
#: values the dashboard's Grafana variables stand for when a query is parsed or evaluated
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$namespace": "ns", "$deployment": "dep"}
ALERT_NAMES = {
    "ReDrafterFallbackActive",
    "ReDrafterAcceptanceBelowMinimum",
    "ReDrafterNoReadyReplica",
    "ReDrafterEngineBuildFailed",
    "ReDrafterValidationFailed",
    "ReDrafterOperatorReconcileErrors",
    "ReDrafterOperatorDown",
    "ReDrafterSpeculationFlapping",
}


# ---- what the exporters export --------------------------------------------------------------
def _sample_names(name: str, kind: str) -> set[str]:
    return {
        "counter": {f"{name}_total"},
        "histogram": {f"{name}_bucket", f"{name}_count", f"{name}_sum"},
        "gauge": {name},
    }[kind]


@cache
def exported() -> dict[str, frozenset[str]]:
    """Sample name -> label names, for every series the operator and the serving pods export."""
    out: dict[str, frozenset[str]] = {"up": frozenset()}
    metrics = OperatorMetrics()
    families = {f.name: f.type for f in metrics.registry.collect()}
    for wrapper in vars(metrics).values():
        if isinstance(wrapper, MetricWrapperBase):
            # prometheus_client keeps a family's label names on its wrapper (no public accessor)
            name, labels = wrapper._name, set(wrapper._labelnames)  # noqa: SLF001
            kind = families[name]
            for sample in _sample_names(name, kind):
                out[sample] = frozenset(labels | ({"le"} if sample.endswith("_bucket") else set()))
    assert {n for n in families} <= {n.removesuffix("_total") for n in out} | {n.rsplit("_", 1)[0] for n in out}, (
        "an OperatorMetrics family is not a public attribute"
    )
    metering = frozenset({c.METRIC_LABEL_MODEL, c.METRIC_LABEL_VARIANT})
    for name in (
        c.METRIC_REQUESTS,
        c.METRIC_OUTPUT_TOKENS,
        c.METRIC_DRAFT_TOKENS,
        c.METRIC_ACCEPTED_DRAFT_TOKENS,
        c.METRIC_STEPS,
    ):
        out[name] = metering
    for sample in _sample_names(c.METRIC_ACCEPTANCE_HISTOGRAM, "histogram"):
        out[sample] = metering | ({"le"} if sample.endswith("_bucket") else set())
    triton = frozenset(c.TRITON_METRIC_LABELS)
    for name in (
        c.METRIC_QUEUE_DURATION,
        c.METRIC_REQUEST_DURATION,
        c.METRIC_REQUEST_SUCCESS,
        c.METRIC_TRTLLM_KV_BLOCKS,
    ):
        out[name] = triton
    out[c.METRIC_TRTLLM_REQUESTS] = triton | {c.METRIC_TRTLLM_LABEL_TYPE}
    for sample in _sample_names(c.METRIC_FIRST_RESPONSE_HISTOGRAM, "histogram"):
        out[sample] = triton | ({"le"} if sample.endswith("_bucket") else set())
    target = set(TARGET_LABELS) | PROMETHEUS_LABELS
    return {k: frozenset(v | target) for k, v in out.items()}


def names_in(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """(metric -> label names matched on it, label names used by grouping/joins/label_replace)."""
    selected: dict[str, set[str]] = {}
    grouping: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, pp.VectorSelector):
            labels = {m.name for m in node.matchers.matchers} if node.matchers else set()
            name = node.name or next((m.value for m in node.matchers.matchers if m.name == "__name__"), None)
            assert name, f"selector without a metric name in {expr!r}"
            selected.setdefault(name, set()).update(labels - {"__name__"})
        elif isinstance(node, pp.AggregateExpr) and node.modifier is not None:
            grouping.update(node.modifier.labels)
        elif isinstance(node, pp.BinaryExpr) and node.modifier is not None:
            if node.modifier.matching is not None:
                grouping.update(node.modifier.matching.labels)
            grouping.update(node.modifier.group_labels or ())
        elif isinstance(node, pp.Call) and node.func.name == "label_replace":
            grouping.add(node.args[3].val)  # the source label (the destination is created here)

    pp.walk(pp.parse(expr), visit)
    return selected, grouping


def check_names(expr: str) -> None:
    known = exported()
    selected, grouping = names_in(expr)
    available: set[str] = set()
    for name, labels in selected.items():
        assert name in known, f"{name} is not exported by the operator or the serving pods ({expr!r})"
        assert labels <= known[name], f"{name} has no label {sorted(labels - known[name])} ({expr!r})"
        available |= known[name]
    created = {m.group(1) for m in re.finditer(r'label_replace\([^,]+,\s*"([^"]+)"', expr)}
    assert grouping <= available | created, (
        f"labels {sorted(grouping - available - created)} not on any series of {expr!r}"
    )


# ---- the dashboard --------------------------------------------------------------------------
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def substitute(expr: str) -> str:
    for var, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return expr


def dashboard_queries() -> list[tuple[str, str]]:
    return prometheus.dashboard_queries(GRAFANA_VARIABLES, DASHBOARD)


def variable_queries() -> list[tuple[str, str, str]]:
    """(variable, series selector, label) of every label_values() template variable."""
    out = []
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"])
            assert m, f"variable {v['name']}: only label_values(selector, label) is used"
            out.append((v["name"], substitute(m.group(1)), m.group(2)))
    return out


def test_dashboard_has_the_panels_and_variables_per_deployment():
    d = dashboard()
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource", "namespace", "deployment"]
    titles = {p["title"] for p in d["panels"] if p["type"] != "row"}
    for wanted in (
        "Active engine",
        "Engine switches",
        "Acceptance rate per engine",
        "Acceptance rate per pod",
        "Tokens per step",
        "Output tokens/s",
        "Requests/s per pod",
        "In-flight and queued requests per pod",
        "Replicas: desired vs ready",
        "Time to first token",
        "Request latency and time per output token",
        "Queue time per request",
        "Engine build state",
        "Validation verdict",
        "Builds by result (all resources)",
        "Reconciles by result",
        "Reconcile latency",
    ):
        assert wanted in titles
    assert any("switches" in a["expr"] for a in d["annotations"]["list"] if "expr" in a)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    # per resource: every query of a serving or per-resource metric is filtered by both variables
    for where, expr in dashboard_queries():
        selected, _ = names_in(expr)
        # the operator's per-resource series carry `name`; the metering model's carry `model`
        per_resource = [
            n for n in selected if {"name", c.METRIC_LABEL_MODEL} & exported()[n] and n.startswith("redrafter_")
        ]
        if per_resource:
            assert '"ns"' in expr and '"dep"' in expr, f"{where} is not filtered by namespace and deployment"


@pytest.mark.parametrize("where,expr", dashboard_queries(), ids=[w for w, _ in dashboard_queries()])
def test_dashboard_queries_use_exported_names_only(where, expr):
    check_names(expr)


def test_dashboard_variables_use_exported_names_only():
    known = exported()
    for name, selector, label in variable_queries():
        check_names(selector)
        metric = next(iter(names_in(selector)[0]))
        assert label in known[metric], f"variable {name}: {metric} has no label {label}"


def test_every_grafana_variable_is_substituted(tmp_path):
    broken = dashboard()
    broken["panels"][1]["targets"][0]["expr"] += " * on () group_left vector($unknown)"
    (tmp_path / "d.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="not substituted"):
        prometheus.dashboard_queries(GRAFANA_VARIABLES, tmp_path / "d.json")


def test_name_check_rejects_what_is_not_exported():
    """The check above can fail: a misspelt metric, a label a metric lacks, a grouping label nobody has."""
    with pytest.raises(AssertionError, match="not exported"):
        check_names('rate(redrafter_acepted_draft_tokens_total{model="x"}[1m])')
    with pytest.raises(AssertionError, match="has no label"):
        check_names('redrafter_operator_active_engine{deployment="x"}')
    with pytest.raises(AssertionError, match="not on any series"):
        check_names("sum by (replica) (redrafter_operator_serving_replicas)")
    with pytest.raises(Exception):
        names_in("sum by (pod (rate(x[1m]))")  # the parser is real: malformed PromQL is refused


# ---- the alert rules ------------------------------------------------------------------------
def rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def runbook_anchors() -> set[str]:
    """GitHub's anchors of the runbook's headings (lower case, punctuation dropped, spaces to dashes)."""
    out = set()
    for line in RUNBOOK.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return out


def test_alerts_are_the_eight_with_summary_description_and_runbook():
    alerts = rules()
    assert {r["alert"] for r in alerts} == ALERT_NAMES and len(alerts) == len(ALERT_NAMES)
    anchors = runbook_anchors()
    for r in alerts:
        ann = r["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}, r["alert"]
        assert ann["runbook_url"].startswith(RUNBOOK_URL), r["alert"]
        anchor = ann["runbook_url"].removeprefix(RUNBOOK_URL)
        assert anchor == r["alert"].lower() and anchor in anchors, f"{r['alert']}: no runbook section #{anchor}"
        assert r["labels"]["severity"] in ("warning", "critical")


@pytest.mark.parametrize("alert", sorted(ALERT_NAMES))
def test_alert_uses_exported_names_only(alert):
    check_names(next(r["expr"] for r in rules() if r["alert"] == alert))


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`; .ci/run installs it)")
    return tool


def test_promtool_checks_the_rules():
    out = subprocess.run([_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(ALERT_NAMES)} rules found" in out.stdout


def test_promtool_unit_tests_fire_and_stay_silent():
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    covered = {t["alertname"] for group in tests for t in group["alert_rule_test"]}
    assert covered == ALERT_NAMES
    for name in ALERT_NAMES:  # each alert is shown firing and not firing
        cases = [t for g in tests for t in g["alert_rule_test"] if t["alertname"] == name]
        assert any(t["exp_alerts"] for t in cases) and any(not t["exp_alerts"] for t in cases), name
    out = subprocess.run(
        [_promtool(), "test", "rules", str(ALERT_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ALERT_TESTS.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_unit_tests_can_fail(tmp_path):
    """A rule with a wrong threshold makes the unit tests fail (they are not vacuous)."""
    tool = _promtool()
    (tmp_path / "a" / "b").mkdir(parents=True)
    rules_dir = tmp_path / "charts" / "redrafter-operator" / "files"
    rules_dir.mkdir(parents=True)
    (rules_dir / ALERTS.name).write_text(
        ALERTS.read_text().replace(
            "(redrafter_operator_engine_switches_total[1h])) > 4",
            "(redrafter_operator_engine_switches_total[1h])) > 40",
        )
    )
    (tmp_path / "a" / "b" / ALERT_TESTS.name).write_text(ALERT_TESTS.read_text())
    out = subprocess.run(
        [tool, "test", "rules", ALERT_TESTS.name], capture_output=True, text=True, timeout=120, cwd=tmp_path / "a" / "b"
    )
    assert out.returncode != 0 and "ReDrafterSpeculationFlapping" in out.stdout + out.stderr
