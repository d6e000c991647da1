"""The kopf shell: the watch-fed indexes, the event handlers that feed the work queue, and startup/cleanup.

* kopf watches ReDrafterDeployments and the labelled children (Jobs, build Pods, Deployments, Services,
  ConfigMaps, NetworkPolicies, InferencePools) and keeps small facts about them in ``@kopf.index``
  indexes; kopf starts handlers only after every index is populated, so a restarted operator sees every
  existing Job before it decides anything (never a duplicate Job).
* ``@kopf.on.event`` handlers do nothing but hand the object to the controller, which enqueues the
  owning resource; every kind the operator applies has one, so drift or a deletion is repaired at once.
* With the GPU node check on, Nodes too (cluster-wide, read-only): an index of what placement reads, and
  an event handler that wakes the resources waiting for a node that can run their GPU Jobs.
  No change-detection handlers, no daemons: kopf itself writes nothing to the resources (no finalizer,
  no annotations), so deletion is never blocked.
* Everything else (the queue's workers, the reconcile, the monitors) is :mod:`.reconciler`.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Mapping

import kopf

from ..api import GROUP, PLURAL, VERSION
from ..render import cache_jobs, inference_pool, names, training, validation
from ..render.placement import Node
from .facts import DeploymentFact, JobFact, ObjectFact, PodFact, RunJobFact, RunPodFact, ServingPodFact
from .observe import NODES
from .reconciler import Controller

LabelFilter = Mapping[str, Any]  # kopf's label filters: a value, kopf.PRESENT/ABSENT or a callback
MANAGED: LabelFilter = {"app.kubernetes.io/managed-by": names.MANAGED_BY}
#: the Jobs that make the cache's artifacts, and their Pods: engine builds and drafter training
BUILD: LabelFilter = {
    **MANAGED,
    names.LABEL_COMPONENT: lambda value, **_: value in ("engine-build", training.COMPONENT),
}
SERVING: LabelFilter = {**MANAGED, names.LABEL_COMPONENT: "serving"}
VALIDATION: LabelFilter = {**MANAGED, names.LABEL_COMPONENT: validation.COMPONENT}
COLLECTION: LabelFilter = {**MANAGED, names.LABEL_COMPONENT: cache_jobs.COMPONENT}
COLLECTION_JOBS: LabelFilter = {
    **MANAGED,
    cache_jobs.LABEL_VERB: kopf.PRESENT,
}  # the CronJob's, and builds that collect first
#: Pods whose termination message the operator reads: validation verdicts, collection reports (the collection
#: CronJob's Jobs, and a build Job that collects before it builds: its init container's report)
RUN_PODS: LabelFilter = {
    **MANAGED,
    names.LABEL_COMPONENT: lambda value, **_: value in (validation.COMPONENT, cache_jobs.COMPONENT),
    "batch.kubernetes.io/job-name": kopf.PRESENT,
}
BEFORE_BUILD_PODS: LabelFilter = {**BUILD, cache_jobs.LABEL_VERB: cache_jobs.VERB_BEFORE_BUILD}


_UNRESOLVED = "Unresolved resources cannot be served"  # kopf 1.45, _core/reactor/observation.py


class OptionalApiFilter(logging.Filter):
    """Drops kopf's warning when the only unresolved resource is the optional InferencePool API.

    Without its CRD (the feature unused) nothing is wrong; a resource that enables it gets the
    ``InferencePoolReady=False CRDNotInstalled`` condition instead, and kopf starts watching once it appears.
    """

    SELECTOR = (
        f"Selector(group='{inference_pool.GROUP}', version='{inference_pool.VERSION}', "
        f"any_name='{inference_pool.PLURAL}')"
    )  # kopf's repr of the handlers' selector

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(_UNRESOLVED) and message.split(":", 1)[-1].strip() == self.SELECTOR)


def _quiet_optional_apis() -> None:
    logger = logging.getLogger("kopf._core.reactor.observation")
    if not any(isinstance(f, OptionalApiFilter) for f in logger.filters):
        logger.addFilter(OptionalApiFilter())


class NoEssenceStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, never computed: this operator registers no change-detecting handlers (no on.create/
    update/resume/delete/field), no daemons or timers, only event handlers and indexes.

    kopf otherwise builds the "essence" of every watched object on every watch event (a deep copy of the
    whole body, then another to strip its progress stanza) only to diff it for such handlers: the largest
    part of the operator's CPU per event, for nothing. With no essence, kopf's diff is empty and nothing it
    does depends on it (it stores a diff base only after change-detecting handlers ran).
    """

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return None  # type: ignore[return-value]  # kopf skips a None essence (processing._detect_causes)


def register(
    registry: kopf.OperatorRegistry,
    make_controller: Callable[[], Awaitable[Controller]],
    configure: Callable[[kopf.OperatorSettings], None] | None = None,
    start: Callable[[Controller], Awaitable[None]] | None = None,
    watch_nodes: bool = True,
) -> None:
    """Register every handler into ``registry`` (a fresh one per run keeps test runs independent).

    ``start`` replaces ``Controller.start`` (leader election starts the loops only while leading).
    ``watch_nodes``: watch Nodes for the GPU placement check (needs cluster-wide list/watch on nodes).
    """
    _quiet_optional_apis()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
        settings.posting.level = logging.INFO
        settings.persistence.finalizer = f"{names.DOMAIN}/kopf-finalizer"  # unused: no handler needs one
        settings.persistence.diffbase_storage = NoEssenceStorage()
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.error_backoffs = [1, 2, 5, 10]
        if configure:
            configure(settings)
        controller = await make_controller()
        controller.indexes = {k: v for k, v in kwargs.items() if k.startswith("rdd_")}
        memo.controller = controller
        await (start or Controller.start)(controller)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        controller = getattr(memo, "controller", None)
        if controller is not None:
            await controller.stop()

    @kopf.index("batch", "v1", "jobs", labels=BUILD, registry=registry, id="rdd_jobs")
    def rdd_jobs(body: kopf.Body, **_: Any) -> dict[Any, JobFact]:
        job = JobFact.from_body(body)
        return {
            ("owner", job.namespace, job.owner): job,
            ("name", job.namespace, job.name): job,
            ("artifact", job.namespace, job.claim, job.artifact): job,
        }

    @kopf.index("", "v1", "pods", labels=BUILD, registry=registry, id="rdd_build_pods")
    def rdd_build_pods(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Any, PodFact]:
        pod = PodFact.from_body(body)
        return {(namespace, pod.job): pod} if pod.job else {}

    @kopf.index("batch", "v1", "jobs", labels=VALIDATION, registry=registry, id="rdd_validation_jobs")
    def rdd_validation_jobs(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, RunJobFact]:
        job = RunJobFact.from_body(body)
        return {("owner", namespace, job.owner): job, ("name", namespace, name): job}

    @kopf.index("batch", "v1", "jobs", labels=COLLECTION_JOBS, registry=registry, id="rdd_collection_jobs")
    def rdd_collection_jobs(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Any, RunJobFact]:
        job = RunJobFact.from_body(body)
        return {(namespace, job.claim): job}

    @kopf.index("", "v1", "pods", labels=RUN_PODS, registry=registry, id="rdd_run_pods")
    def rdd_run_pods(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Any, RunPodFact]:
        pod = RunPodFact.from_body(body)
        return {(namespace, pod.job): pod}

    @kopf.index("", "v1", "pods", labels=BEFORE_BUILD_PODS, registry=registry, id="rdd_before_build_pods")
    def rdd_before_build_pods(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Any, RunPodFact]:
        pod = RunPodFact.from_body(body)
        return {(namespace, pod.job): pod}

    @kopf.index("batch", "v1", "cronjobs", labels=COLLECTION, registry=registry, id="rdd_cronjobs")
    def rdd_cronjobs(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, ObjectFact]:
        return {("name", namespace, name): ObjectFact.from_body(body)}

    @kopf.index("", "v1", "pods", labels=SERVING, registry=registry, id="rdd_serving_pods")
    def rdd_serving_pods(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Any, ServingPodFact]:
        """Serving Pods: the scheduler's and the kubelet's word on why a rollout does not progress."""
        pod = ServingPodFact.from_body(body)
        return {("owner", namespace, pod.owner): pod} if pod.owner else {}

    @kopf.index("apps", "v1", "deployments", labels=MANAGED, registry=registry, id="rdd_deployments")
    def rdd_deployments(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Any, DeploymentFact]:
        dep = DeploymentFact.from_body(body)
        owner = (body.get("metadata", {}).get("labels") or {}).get(names.LABEL_DEPLOYMENT, "")
        return {("owner", namespace, owner): dep, ("name", namespace, dep.name): dep}

    @kopf.index("", "v1", "services", labels=MANAGED, registry=registry, id="rdd_services")
    def rdd_services(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, ObjectFact]:
        return {("name", namespace, name): ObjectFact.from_body(body)}

    @kopf.index("", "v1", "configmaps", labels=MANAGED, registry=registry, id="rdd_configmaps")
    def rdd_configmaps(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, ObjectFact]:
        return {("name", namespace, name): ObjectFact.from_body(body)}

    @kopf.index(
        "networking.k8s.io", "v1", "networkpolicies", labels=MANAGED, registry=registry, id="rdd_networkpolicies"
    )
    def rdd_networkpolicies(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, ObjectFact]:
        return {("name", namespace, name): ObjectFact.from_body(body)}

    # The InferencePool CRD may be absent (the feature is optional): kopf then serves nothing for these two
    # handlers and starts watching as soon as the CRD is installed (it watches CRDs); indexes never block on it.
    @kopf.index(
        inference_pool.GROUP,
        inference_pool.VERSION,
        inference_pool.PLURAL,
        labels=MANAGED,
        registry=registry,
        id="rdd_inferencepools",
    )
    def rdd_inferencepools(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, ObjectFact]:
        return {("name", namespace, name): ObjectFact.from_body(body)}

    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="rdd_ready")
    def rdd_ready(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, str]:
        """Artifacts a resource's status shows Ready: they outlive the Jobs that built them."""
        claim = ((body.get("spec") or {}).get("engine") or {}).get("cache", {}).get("claimName", "engine-cache")
        status = body.get("status") or {}
        artifacts = [*((status.get("engines") or {}).values()), status.get("drafter")]
        return {
            (namespace, claim, e["path"]): name
            for e in artifacts
            if isinstance(e, dict) and e.get("state") in ("Ready", "Cached") and e.get("path")
        }

    if watch_nodes:

        @kopf.index("", "v1", "nodes", registry=registry, id="rdd_nodes")
        def rdd_nodes(body: kopf.Body, **_: Any) -> dict[Any, Node]:
            return {NODES: Node.from_body(body)}

        @kopf.on.event("", "v1", "nodes", registry=registry, id="node_event")
        def node_event(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
            memo.controller.on_node_event(event["object"], deleted=event.get("type") == "DELETED")

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="rdd_event")
    def rdd_event(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
        memo.controller.adopt_posting_context()
        memo.controller.on_resource_event(event.get("type"), event["object"])

    def child_event(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
        memo.controller.on_child_event(event["object"], deleted=event.get("type") == "DELETED")

    kopf.on.event("batch", "v1", "jobs", labels=BUILD, registry=registry, id="job_event")(child_event)
    kopf.on.event("", "v1", "pods", labels=BUILD, registry=registry, id="build_pod_event")(child_event)
    kopf.on.event("", "v1", "pods", labels=SERVING, registry=registry, id="serving_pod_event")(child_event)
    kopf.on.event("batch", "v1", "jobs", labels=VALIDATION, registry=registry, id="validation_job_event")(child_event)
    kopf.on.event("", "v1", "pods", labels=RUN_PODS, registry=registry, id="run_pod_event")(child_event)
    kopf.on.event("batch", "v1", "cronjobs", labels=COLLECTION, registry=registry, id="cronjob_event")(child_event)
    kopf.on.event("apps", "v1", "deployments", labels=MANAGED, registry=registry, id="deployment_event")(child_event)
    kopf.on.event("", "v1", "services", labels=MANAGED, registry=registry, id="service_event")(child_event)
    kopf.on.event("", "v1", "configmaps", labels=MANAGED, registry=registry, id="configmap_event")(child_event)
    kopf.on.event(
        "networking.k8s.io", "v1", "networkpolicies", labels=MANAGED, registry=registry, id="networkpolicy_event"
    )(child_event)
    kopf.on.event(
        inference_pool.GROUP,
        inference_pool.VERSION,
        inference_pool.PLURAL,
        labels=MANAGED,
        registry=registry,
        id="inferencepool_event",
    )(child_event)


__all__ = ["register"]
