"""What the operator's ServiceAccount must be allowed: the one list of its RBAC needs.

The chart's rules (templates/_helpers.tpl: namespacedRules, clusterRules, nodeRules, leaseRules) render exactly these,
and tests/e2e/test_chart.py holds both ends: the chart's rules equal this list, and the operator, run from
the chart against the real control plane, calls exactly what the chart grants. ``redrafter-operator
check`` asks the API server (SubjectAccessReview) whether the ServiceAccount may do each of them.
"""

from __future__ import annotations

from dataclasses import dataclass

RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class Rule:
    """One PolicyRule: every (group, resource, verb) of the product."""

    groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def calls(self) -> set[tuple[str, str, str]]:
        return {(g, r, v) for g in self.groups for r in self.resources for v in self.verbs}

    def as_policy_rule(self) -> dict[str, list[str]]:
        return {"apiGroups": list(self.groups), "resources": list(self.resources), "verbs": list(self.verbs)}


_WRITES = ("list", "watch", "create", "patch")

#: on namespaced resources, in every namespace the operator watches (a ClusterRole in cluster-wide mode)
NAMESPACED: tuple[Rule, ...] = (
    Rule(("redrafter.dev",), ("redrafterdeployments",), ("list", "watch")),
    Rule(("redrafter.dev",), ("redrafterdeployments/status",), ("patch",)),
    Rule(("batch",), ("jobs",), _WRITES),
    Rule(("batch",), ("cronjobs",), (*_WRITES, "delete")),
    Rule(("apps",), ("deployments",), _WRITES),
    Rule(("",), ("services", "configmaps"), _WRITES),
    Rule(("",), ("pods",), ("list", "watch")),
    Rule(("networking.k8s.io",), ("networkpolicies",), _WRITES),
    Rule(("inference.networking.k8s.io",), ("inferencepools",), (*_WRITES, "delete")),
    Rule(("",), ("events",), ("create",)),
)
#: cluster-scoped, in every mode: kopf watches CRDs
CLUSTER: tuple[Rule, ...] = (Rule(("apiextensions.k8s.io",), ("customresourcedefinitions",), ("list", "watch")),)
#: cluster-scoped, in namespaced mode only: kopf lists and watches the namespaces to find the watched ones
NAMESPACED_MODE_CLUSTER: tuple[Rule, ...] = (Rule(("",), ("namespaces",), ("list", "watch")),)
#: cluster-scoped, with the GPU node check (the chart's gpuNodeCheck; not with --no-gpu-node-check): the
#: operator watches Nodes to create a GPU Job only when some node could run it
NODES: tuple[Rule, ...] = (Rule(("",), ("nodes",), ("list", "watch")),)
#: leader election (more than one replica), in the operator's own namespace
LEASE: tuple[Rule, ...] = (Rule(("coordination.k8s.io",), ("leases",), ("get", "create", "update")),)


def calls(rules: tuple[Rule, ...]) -> set[tuple[str, str, str]]:
    out: set[tuple[str, str, str]] = set()
    for rule in rules:
        out |= rule.calls()
    return out
