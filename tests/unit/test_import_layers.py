"""The import graph points one way: the layer order, no cycles, and the development package off the production path.

The graph is grimp's (it parses every module, function-local and ``TYPE_CHECKING`` imports included),
so an import hidden inside a function to dodge a cycle still counts as the cycle it is.
Tests, benches and the sim may import anything; this constrains the packages that ship.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

PACKAGES = ("redrafter_operator", "engine_jobs", "redrafter_sim")

# Highest first: a layer may import the layers below it, never one above. A set is one layer whose
# members must not import each other (independent siblings).
OPERATOR_LAYERS: list[str | set[str]] = [
    "cli",  # the command line: everything else is reached from here
    "cache_cli",  # `cache ls|gc`: engine_jobs' cache code, locally or in a pod through the API
    # kopf shell, reconciler, evaluators, planner / `check`, a preflight read through the API: neither imports the other
    {"controller", "check"},
    "policy",  # speculation policy and autoscaler, pure
    "metrics",  # reads serving pods' metrics (scrape / Prometheus)
    "render",  # manifests from the spec
    {"api", "evaluate"},  # the CRD's models / the evaluation tool the validation Job runs: neither knows the other
    {"yamlio", "kubeconfig"},  # YAML output / where the API client's configuration comes from
]

# Inside the controller: the shell on top, the pure planner and the shared resource I/O below.
CONTROLLER_LAYERS: list[str | set[str]] = [
    "main",  # `redrafter-operator run`: its flags, parsed into the process's options
    "process",  # the operator process: wires kopf, the controller, its monitors and the election
    "leader",  # Lease leader election: gates the loops main starts
    "handlers",  # the kopf shell: indexes, event handlers, startup
    "reconciler",  # the controller's state, workers and the reconcile of one resource: the only writer
    {"speculation", "retention", "training", "observe"},  # the monitors, and index reading, each on its own
    "preview",  # what `redrafter-operator render` plans, from stated facts
    "planner",  # one plan step, folding in the monitors' reports (pure: it imports no monitor)
    "drafter",  # the trained drafter: a stage before the ReDrafter engine
    {
        "engines",
        "status",
        "routing",
        "collection",
    },  # routing: the InferencePool beside the Service; the cache's children
    "targets",  # serving targets and the blue/green step
    "renderers",
    "reports",  # what the monitors hand the planner
    {"validation", "serving_health", "condition_set"},  # pure rules: the validation gate, serving failures, conditions
    "resource_io",  # what the reconciler and the monitors share
    "workqueue",
    {"apply", "metrics", "clock"},
    "plan_types",
    {"facts", "conditions", "build_failure"},
    "fingerprints",  # what the operator's apply owns of a child, hashed
]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(
        *PACKAGES, include_external_packages=False, exclude_type_checking_imports=False, cache_dir=None
    )  # no cache directory written into the checkout


def _layers(spec: list[str | set[str]]) -> list[grimp.Layer]:
    return [
        grimp.Layer(*sorted(layer), independent=True) if isinstance(layer, set) else grimp.Layer(layer)
        for layer in spec
    ]


def _describe(dependencies: set[grimp.PackageDependency]) -> str:
    lines = []
    for dep in sorted(dependencies, key=lambda d: (d.importer, d.imported)):
        for route in dep.routes:
            for head in route.heads:
                for tail in route.tails:
                    lines.append(
                        f"{dep.importer} -> {dep.imported}: {head} -> {' -> '.join(route.middle)}"
                        f"{' -> ' if route.middle else ''}{tail}"
                    )
    return "\n".join(sorted(set(lines)))


def _unplaced(graph: grimp.ImportGraph, container: str, layers: list[str | set[str]]) -> set[str]:
    """The container's modules the layer order does not name (a new module must be placed)."""
    named = {f"{container}.{m}" for layer in layers for m in ([layer] if isinstance(layer, str) else layer)}
    return set(graph.find_children(container)) - named


@pytest.mark.parametrize(
    ("container", "layers"),
    [("redrafter_operator", OPERATOR_LAYERS), ("redrafter_operator.controller", CONTROLLER_LAYERS)],
)
def test_layers_point_one_way(graph: grimp.ImportGraph, container: str, layers: list[str | set[str]]) -> None:
    unplaced = _unplaced(graph, container, layers)
    assert not unplaced, f"place these modules in the layer order of {container}: {sorted(unplaced)}"
    illegal = graph.find_illegal_dependencies_for_layers(layers=_layers(layers), containers={container})
    assert not illegal, f"imports against the layer order of {container}:\n{_describe(illegal)}"


def find_cycles(graph: grimp.ImportGraph) -> set[str]:
    """Every direct import A -> B that lies on a cycle, as the cycle: A -> B -> ... -> A.

    A -> B is on a cycle exactly when B also reaches A; grimp's shortest chain names the way back.
    """
    cycles = set()
    for importer in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(importer):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                cycles.add(" -> ".join((importer, *back)))
    return cycles


def test_no_import_cycles(graph: grimp.ImportGraph) -> None:
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))


@pytest.mark.parametrize("production", ["redrafter_operator", "engine_jobs"])
def test_production_code_never_imports_the_sim(graph: grimp.ImportGraph, production: str) -> None:
    chains = graph.find_shortest_chains(importer=production, imported="redrafter_sim", as_packages=True)
    assert not chains, f"{production} reaches the development package: " + "; ".join(" -> ".join(c) for c in chains)


def test_engine_jobs_stands_alone(graph: grimp.ImportGraph) -> None:
    """The build and serving images carry engine_jobs without the operator package."""
    chains = graph.find_shortest_chains(importer="engine_jobs", imported="redrafter_operator", as_packages=True)
    assert not chains, "engine_jobs imports the operator: " + "; ".join(" -> ".join(c) for c in chains)


def test_the_cycle_check_sees_function_local_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle hidden in a function body (the usual way to dodge one) is still found."""
    pkg = tmp_path / "cyclic_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def helper() -> int:\n    from .high import VALUE\n\n    return VALUE\n")
    (pkg / "high.py").write_text("from .low import helper\n\nVALUE = 1\n")
    (pkg / "alone.py").write_text("import os\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = grimp.build_graph("cyclic_probe", cache_dir=None)
    assert find_cycles(probe) == {
        "cyclic_probe.high -> cyclic_probe.low -> cyclic_probe.high",
        "cyclic_probe.low -> cyclic_probe.high -> cyclic_probe.low",
    }
