"""What the cluster looks like for one resource: its children's facts, read from the kopf indexes.

The reconciler plans from these :class:`~.facts.Observed` values only. The indexes are filled by the
watches before any handler runs, so a restarted operator sees every existing Job before it decides;
the one exception read from the API is a failed build's Pod message (the Pod watch may lag the Job's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from engine_jobs.contract import VARIANTS

from ..api.spec import ReDrafterDeploymentSpec
from ..render import names
from ..render.build import artifact_path, drafter_path
from .apply import ChildState, KubeClient
from .facts import (
    JOB_NAME_LABELS,
    DeploymentFact,
    JobFact,
    ObjectFact,
    Observed,
    PodFact,
    RunJobFact,
    RunPodFact,
    ServingPodFact,
    SharedArtifact,
)
from .plan_types import Resource
from .resource_io import index_entries

ClaimRef = tuple[str, str, str]  # (namespace, cache claim, artifact path)
NODES = "nodes"  # the one key of the rdd_nodes index (absent: nodes are not watched)


@dataclass
class BuildClaim:
    """A build Job this process started and may not see in the index yet."""

    job: str
    owner: str
    at: float  # time.monotonic() when claimed


def cache_of(spec: ReDrafterDeploymentSpec | None, keys: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The cache claim and the artifact path of each variant, and of the drafter the operator trains (empty for
    an invalid spec)."""
    if spec is None:
        return "", {}
    paths: dict[str, str] = {v: artifact_path(spec, keys[v]) for v in VARIANTS}
    if "drafter" in keys:
        paths["drafter"] = drafter_path(spec, keys["drafter"])
    return spec.engine.cache.claim_name, paths


def child_state(indexes: Mapping[str, Any], manifest: Mapping[str, Any]) -> ChildState | None:
    """What the watch shows of the child ``manifest`` names (None when absent): its resourceVersion and the
    fingerprint of the fields the operator owns (a Job only needs to exist: it is created, never applied)."""
    ns, name, kind = manifest["metadata"]["namespace"], manifest["metadata"]["name"], manifest["kind"]
    if kind == "Job":
        found = any(index_entries(indexes, i, ("name", ns, name)) for i in ("rdd_jobs", "rdd_validation_jobs"))
        return ChildState("", "") if found else None
    index = {
        "Deployment": "rdd_deployments",
        "Service": "rdd_services",
        "ConfigMap": "rdd_configmaps",
        "NetworkPolicy": "rdd_networkpolicies",
        "InferencePool": "rdd_inferencepools",
        "CronJob": "rdd_cronjobs",
    }[kind]
    facts = index_entries(indexes, index, ("name", ns, name))
    return ChildState(facts[0].resource_version, facts[0].owned_fields, facts[0].owned_content) if facts else None


def _latest_message(indexes: Mapping[str, Any], ns: str, job: str) -> PodFact | None:
    """The newest of a build Job's Pods that left a termination message."""
    facts: list[PodFact] = index_entries(indexes, "rdd_build_pods", (ns, job))
    with_msg = [p for p in facts if p.message]
    return max(with_msg, key=lambda p: p.started) if with_msg else None


def observe(
    indexes: Mapping[str, Any],
    res: Resource,
    claim: str,
    paths: Mapping[str, str],
    claims: Mapping[ClaimRef, BuildClaim],
    *,
    claim_seconds: float,
    now: float,
) -> Observed:
    """The facts the planner needs for ``res``: its Jobs (and failed builds' Pods), Deployments, the pool the
    Service (and the InferencePool) selects, and for each variant's artifact who in the namespace already
    built or is building it."""
    ns = res.namespace
    owner = names.label_value(res.name)
    jobs: list[JobFact] = index_entries(indexes, "rdd_jobs", ("owner", ns, owner))
    pods = {}
    for job in jobs:
        if job.state in ("Failed", "Succeeded"):  # why it failed / what it built (size, built-at)
            pod = _latest_message(indexes, ns, job.name)
            if pod is not None:
                pods[job.name] = pod
    deployments: dict[str, DeploymentFact] = {}
    for dep in index_entries(indexes, "rdd_deployments", ("owner", ns, owner)):
        if dep.name == names.serving_deployment_name(res.name, dep.variant):
            deployments[dep.variant] = dep
        elif dep.name == names.canary_deployment_name(res.name):
            deployments["canary"] = dep
        elif dep.name == names.candidate_name(res.name):
            deployments["candidate"] = dep
    serving_pods: list[ServingPodFact] = sorted(
        index_entries(indexes, "rdd_serving_pods", ("owner", ns, owner)), key=lambda p: p.name
    )
    services: list[ObjectFact] = index_entries(indexes, "rdd_services", ("name", ns, names.service_name(res.name)))
    pools: list[ObjectFact] = index_entries(indexes, "rdd_inferencepools", ("name", ns, names.service_name(res.name)))
    shared: dict[str, SharedArtifact] = {}
    for variant, path in paths.items():
        ready_by = building = built_message = ""
        for job in index_entries(indexes, "rdd_jobs", ("artifact", ns, claim, path)):
            if job.state == "Succeeded":
                ready_by = f"Job {job.name}"
                pod = _latest_message(indexes, ns, job.name)
                built_message = pod.message if pod is not None else built_message
            elif job.state == "Running" and job.owner != owner:
                building = job.name
        for other in index_entries(indexes, "rdd_ready", (ns, claim, path)):
            if other != res.name:
                ready_by = ready_by or f"ReDrafterDeployment {other}"
        c = claims.get((ns, claim, path))
        if (
            c
            and not building
            and c.owner != res.name
            and now - c.at < claim_seconds
            and not index_entries(indexes, "rdd_jobs", ("name", ns, c.job))
        ):  # once seen, the Job itself tells
            building = c.job
        shared[variant] = SharedArtifact(ready_by=ready_by, building_job=building, built_message=built_message)
    validation_jobs: dict[str, RunJobFact] = {
        j.name: j for j in index_entries(indexes, "rdd_validation_jobs", ("owner", ns, owner))
    }
    validation_pods: dict[str, RunPodFact] = {}
    for name in validation_jobs:
        runs: list[RunPodFact] = index_entries(indexes, "rdd_run_pods", (ns, name))
        if runs:  # the Job's most recent pod: its verdict is the current one
            validation_pods[name] = max(runs, key=lambda p: (p.created, p.name))
    return Observed(
        jobs=jobs,
        pods=pods,
        deployments=deployments,
        serving_pods=serving_pods,
        service_pool=services[0].pool if services else None,
        routing_pool=pools[0].pool if pools else None,
        shared=shared,
        validation_jobs=validation_jobs,
        validation_pods=validation_pods,
        nodes=tuple(index_entries(indexes, "rdd_nodes", NODES)) if "rdd_nodes" in indexes else None,
    )


class FailedPodMessages:
    """A failed Job's termination message, read once from its Pod if the Pod watch lags behind.

    The Job and Pod watches are independent streams; the Job's Failed event can arrive first.
    One label-selected LIST per failed Job (cached) keeps the reason in the very first status.
    """

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._cache: dict[tuple[str, str], PodFact] = {}
        self._runs: dict[tuple[str, str], RunPodFact] = {}

    async def _job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The Job's Pods, by the label the Job controller sets (one LIST)."""
        found = await self.client.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query=[("labelSelector", f"{JOB_NAME_LABELS[0]}={job}")]
        )
        return list(found.get("items") or [])

    async def fill(self, namespace: str, observed: Observed) -> None:
        for job in observed.jobs:
            if job.state != "Failed" or job.name in observed.pods:
                continue
            cached = self._cache.get((namespace, job.name))
            if cached is None:
                pods = [PodFact.from_body(p) for p in await self._job_pods(namespace, job.name)]
                with_msg = [p for p in pods if p.message]
                cached = max(with_msg, key=lambda p: p.started) if with_msg else PodFact(job.name, "", "")
                self._cache[(namespace, job.name)] = cached
            if cached.message:
                observed.pods[job.name] = cached

    async def fill_validation(self, namespace: str, observed: Observed) -> None:
        """The verdict of a finished validation Job whose Pod the watch has not delivered yet (one LIST per Job)."""
        for job in observed.validation_jobs.values():
            seen = observed.validation_pods.get(job.name)
            if job.result is None or (seen is not None and seen.messages):
                continue  # running, or its verdict is in the index (the Pod's event may trail the Job's)
            cached = self._runs.get((namespace, job.name))
            if cached is None:
                runs = [RunPodFact.from_body(p) for p in await self._job_pods(namespace, job.name)]
                if not runs:
                    continue
                cached = max(runs, key=lambda p: (p.created, p.name))
                if cached.messages:
                    self._runs[(namespace, job.name)] = cached
            observed.validation_pods[job.name] = cached

    def forget(self, namespace: str, name: str) -> None:
        """Drop the messages of a deleted resource's build Jobs."""
        for ref in [r for r in self._cache if r[0] == namespace and r[1].startswith(f"{name}-build-")]:
            del self._cache[ref]
        for ref in [r for r in self._runs if r[0] == namespace and r[1].startswith(f"{name}-validate-")]:
            del self._runs[ref]
