"""The kopf shell: watch-fed indexes, a deduplicating work queue, and the thin reconcile loop.

Shape (controller-runtime style, on kopf):
  * kopf watches ReDrafterDeployments and the labelled children (Jobs, build Pods, Deployments,
    Services, ConfigMaps) and keeps small facts about them in ``@kopf.index`` indexes; kopf starts
    handlers only after every index is populated, so a restarted operator sees every existing Job
    before it decides anything (never a duplicate Job).
  * ``@kopf.on.event`` handlers do nothing but enqueue the owning resource (and resources waiting
    for the same shared artifact). No change-detection handlers, no daemons: kopf itself writes
    nothing to the resources (no finalizer, no annotations), so deletion is never blocked.
  * N workers take resources from the queue (one at a time per resource, deduplicated), call the
    pure planner, create-or-patch children, patch status only when it changed, post Events.
    Errors requeue the resource with exponential backoff; a periodic resync catches missed events.
  * Policy seam (issue 6): ``Controller.set_targets`` (desired active engine + replicas per variant,
    applied blue/green by the planner) and ``Controller.add_evaluator`` (a per-resource timer slot).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol

import kopf
from pydantic import ValidationError

from ..api import GROUP, KIND, PLURAL, VERSION
from ..api.spec import ReDrafterDeploymentSpec
from ..api.types import parse_duration
from ..render import names
from .apply import ApiError, Applier, ChildState, KubeClient, merge_patch
from .facts import DeploymentFact, JobFact, ObjectFact, Observed, PodFact, SharedArtifact
from .metrics import OperatorMetrics
from .planner import Plan, Renderers, Resource, ServingTargets, plan

log = logging.getLogger("redrafter_operator.controller")

Key = tuple[str, str]  # (namespace, name)
MANAGED = {"app.kubernetes.io/managed-by": names.MANAGED_BY}
BUILD = {**MANAGED, names.LABEL_COMPONENT: "engine-build"}
MAX_BACKOFF = 300.0


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class WorkQueue:
    """Deduplicating queue: a key is queued at most once and never processed by two workers at once."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, key: Key) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        old = self._timers.pop(key, None)
        if old:
            old.cancel()
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> Key:
        key = await self._queue.get()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: Key) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def idle(self) -> bool:
        return not self._queued and not self._active

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


class Evaluator(Protocol):
    """A per-resource periodic task (the speculation policy / autoscaler plugs in here)."""

    def interval(self, body: Mapping[str, Any]) -> float: ...

    async def evaluate(self, controller: "Controller", body: Mapping[str, Any]) -> None: ...


@dataclass
class ControllerSettings:
    workers: int = 4
    resync_seconds: float = 300.0
    claim_seconds: float = 120.0  # how long an in-flight build claim is trusted before its Job is seen


@dataclass
class _Claim:
    job: str
    owner: str
    at: float


@dataclass
class Controller:
    """Process-wide state of one running operator (kept in kopf's memo)."""

    client: KubeClient
    renderers: Renderers
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    settings: ControllerSettings = field(default_factory=ControllerSettings)

    def __post_init__(self) -> None:
        self.bodies: dict[Key, dict[str, Any]] = {}
        self.queue = WorkQueue()
        self.indexes: Mapping[str, Any] = {}
        self.claims: dict[tuple[str, str, str], _Claim] = {}  # (ns, claim, path) -> build started here
        self.written: dict[Key, dict[str, Any]] = {}  # last status written, until the watch echoes it
        self.targets: dict[Key, ServingTargets] = {}
        self.waiting: dict[Key, set[tuple[str, str]]] = {}  # resource -> {(claim, path)} it waits for
        self.failures: dict[Key, int] = {}
        self.evaluators: list[Evaluator] = []
        self._next_eval: dict[tuple[Key, int], float] = {}
        self.applier = Applier(self.client, self._child_state)
        self._tasks: list[asyncio.Task[None]] = []
        self._pod_messages: dict[tuple[str, str], PodFact] = {}
        self._locks: dict[Key, asyncio.Lock] = {}
        self._posting_vars: list[tuple[contextvars.ContextVar[Any], Any]] = []

    def adopt_posting_context(self) -> None:
        """Remember kopf's Event-posting queue, which kopf only exposes inside its handlers' context.

        kopf.info/warn find their queue through context variables set per watched object; our workers
        run outside those tasks, so they adopt the variables captured from a handler (once).
        """
        if not self._posting_vars:
            self._posting_vars = [(var, value) for var, value in contextvars.copy_context().items()
                                  if var.name in ("event_queue_var", "event_queue_loop_var")]

    # ---- the policy seam --------------------------------------------------------------------
    def set_targets(self, namespace: str, name: str, targets: ServingTargets | None) -> None:
        """Ask for an active engine + replicas per variant; the next reconcile applies it blue/green."""
        key = (namespace, name)
        if targets is None:
            self.targets.pop(key, None)
        elif self.targets.get(key) != targets:
            self.targets[key] = targets
        else:
            return
        self.queue.add(key)

    def add_evaluator(self, evaluator: Evaluator) -> None:
        self.evaluators.append(evaluator)

    def lock(self, key: Key) -> asyncio.Lock:
        """One writer of a resource's status at a time: the reconciler and the evaluators both write
        ``status.conditions`` (a list: a merge patch replaces it whole), so they take turns per resource
        and each plans from the other's last write (``written``), never from a stale watch event."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    # ---- indexes ----------------------------------------------------------------------------
    def _store(self, index: str, key: Any) -> list[Any]:
        idx = self.indexes.get(index)
        if idx is None or key not in idx:
            return []
        return list(idx[key])

    def _child_state(self, manifest: Mapping[str, Any]) -> ChildState | None:
        ns, name, kind = manifest["metadata"]["namespace"], manifest["metadata"]["name"], manifest["kind"]
        if kind == "Job":
            return ChildState("", "") if self._store("rdd_jobs", ("name", ns, name)) else None
        index = {"Deployment": "rdd_deployments", "Service": "rdd_services", "ConfigMap": "rdd_configmaps"}[kind]
        facts = self._store(index, ("name", ns, name))
        return ChildState(facts[0].resource_version, facts[0].owned_fields) if facts else None

    def observe(self, res: Resource, claim: str, paths: Mapping[str, str]) -> Observed:
        ns = res.namespace
        owner = names.label_value(res.name)
        jobs: list[JobFact] = self._store("rdd_jobs", ("owner", ns, owner))
        pods = {}
        for job in jobs:
            if job.state == "Failed":
                facts: list[PodFact] = self._store("rdd_build_pods", (ns, job.name))
                with_msg = [p for p in facts if p.message]
                if with_msg:
                    pods[job.name] = max(with_msg, key=lambda p: p.started)
        deployments: dict[str, DeploymentFact] = {}
        for dep in self._store("rdd_deployments", ("owner", ns, owner)):
            if dep.name == names.serving_deployment_name(res.name, dep.variant):
                deployments[dep.variant] = dep
            elif dep.name == names.canary_deployment_name(res.name):
                deployments["canary"] = dep
            elif dep.name == names.candidate_name(res.name):
                deployments["candidate"] = dep
        services: list[ObjectFact] = self._store("rdd_services", ("name", ns, names.service_name(res.name)))
        shared: dict[str, SharedArtifact] = {}
        now = time.monotonic()
        for variant, path in paths.items():
            ready_by = building = ""
            for job in self._store("rdd_jobs", ("artifact", ns, claim, path)):
                if job.state == "Succeeded":
                    ready_by = f"Job {job.name}"
                elif job.state == "Running" and job.owner != owner:
                    building = job.name
            for other in self._store("rdd_ready", (ns, claim, path)):
                if other != res.name:
                    ready_by = ready_by or f"ReDrafterDeployment {other}"
            c = self.claims.get((ns, claim, path))
            if (c and not building and c.owner != res.name and now - c.at < self.settings.claim_seconds
                    and not self._store("rdd_jobs", ("name", ns, c.job))):  # once seen, the Job itself tells
                building = c.job
            shared[variant] = SharedArtifact(ready_by=ready_by, building_job=building)
        return Observed(jobs=jobs, pods=pods, deployments=deployments,
                        service_pool=services[0].pool if services else None, shared=shared)

    async def _read_failed_pods(self, namespace: str, observed: Observed) -> None:
        """A failed Job's termination message, read once from its Pod if the Pod watch lags behind.

        The Job and Pod watches are independent streams; the Job's Failed event can arrive first.
        One label-selected LIST per failed Job (cached) keeps the reason in the very first status.
        """
        for job in observed.jobs:
            if job.state != "Failed" or job.name in observed.pods:
                continue
            cached = self._pod_messages.get((namespace, job.name))
            if cached is None:
                found = await self.client.request(
                    "GET", f"/api/v1/namespaces/{namespace}/pods",
                    query=[("labelSelector", f"batch.kubernetes.io/job-name={job.name}")])
                pods = [PodFact.from_body(p) for p in found.get("items") or []]
                with_msg = [p for p in pods if p.message]
                cached = max(with_msg, key=lambda p: p.started) if with_msg else PodFact(job.name, "", "")
                self._pod_messages[(namespace, job.name)] = cached
            if cached.message:
                observed.pods[job.name] = cached

    # ---- queueing ---------------------------------------------------------------------------
    def on_resource_event(self, event_type: str | None, raw: Mapping[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name", ""))
        if event_type == "DELETED":
            self.bodies.pop(key, None)
            self.written.pop(key, None)
            self.targets.pop(key, None)
            self.waiting.pop(key, None)
            self.failures.pop(key, None)
            lock = self._locks.get(key)
            if lock is not None and not lock.locked():
                del self._locks[key]
            self.metrics.set_phase(key[0], key[1], None)
            self.applier.forget(key[0])
            for ref in [r for r in self._pod_messages if r[0] == key[0] and r[1].startswith(f"{key[1]}-build-")]:
                del self._pod_messages[ref]
            self.metrics.resources.set(len(self.bodies))
            return
        body = copy.deepcopy(dict(raw))
        written = self.written.get(key)
        if written is not None and _same_status(body.get("status") or {}, written):
            self.written.pop(key, None)  # the watch caught up with our last write
        old = self.bodies.get(key)
        self.bodies[key] = body
        self.metrics.resources.set(len(self.bodies))
        if old is None or _reconcile_relevant(old) != _reconcile_relevant(body):
            self.queue.add(key)

    def on_child_event(self, raw: Mapping[str, Any], event_type: str | None = None) -> None:
        meta = raw.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        if event_type == "DELETED":  # the applier re-creates it at the owner's reconcile, enqueued below
            self.applier.forget_object(raw.get("kind", ""), ns, meta.get("name", ""))
        owners = [r.get("name") for r in meta.get("ownerReferences") or [] if r.get("kind") in (KIND, "Job")]
        for name in owners:
            if (ns, name) in self.bodies:
                self.queue.add((ns, name))
            else:  # a build Pod: its owner is a Job, whose owner is the resource
                for job in self._store("rdd_jobs", ("name", ns, name)):
                    self._enqueue_owner(ns, job.owner)
        if raw.get("kind") == "Job":
            job = JobFact.from_body(raw)
            for key, waits in self.waiting.items():
                if key[0] == ns and (job.claim, job.artifact) in waits:
                    self.queue.add(key)

    def _enqueue_owner(self, ns: str, owner_label: str) -> None:
        for key in self.bodies:
            if key[0] == ns and names.label_value(key[1]) == owner_label:
                self.queue.add(key)

    # ---- the loop ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(i), name=f"redrafter-worker-{i}")
                       for i in range(self.settings.workers)]
        self._tasks.append(asyncio.create_task(self._ticker(), name="redrafter-ticker"))

    async def stop(self) -> None:
        self.queue.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.client.close()

    async def _ticker(self) -> None:
        """Periodic resync (missed events) and the per-resource evaluator slots."""
        last_resync = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            self.metrics.queue_depth.set(len(self.queue))
            now = time.monotonic()
            if now - last_resync >= self.settings.resync_seconds:
                last_resync = now
                for key in list(self.bodies):
                    self.queue.add(key)
                for ref in [r for r, c in self.claims.items() if now - c.at > self.settings.claim_seconds]:
                    del self.claims[ref]
                for ref in [r for r in self._next_eval if r[0] not in self.bodies]:
                    del self._next_eval[ref]
            for i, ev in enumerate(self.evaluators):
                for key, body in list(self.bodies.items()):
                    due = self._next_eval.get((key, i), 0.0)
                    if now < due:
                        continue
                    try:
                        self._next_eval[(key, i)] = now + max(1.0, ev.interval(body))
                        async with self.lock(key):
                            await ev.evaluate(self, body)
                    except Exception:  # an evaluator's bug must not stop serving reconciles
                        log.exception("evaluator %s failed for %s/%s", type(ev).__name__, *key)

    async def _worker(self, n: int) -> None:
        while True:
            key = await self.queue.get()
            for var, value in self._posting_vars:
                var.set(value)
            try:
                async with self.lock(key):
                    await self.reconcile(key)
                self.failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = self.failures.get(key, 0) + 1
                self.failures[key] = failures
                delay = min(MAX_BACKOFF, 0.5 * 2 ** (failures - 1))
                reason = exc.reason if isinstance(exc, ApiError) else type(exc).__name__
                self.metrics.reconciles.labels("error").inc()
                self.metrics.errors.labels(reason).inc()
                log.warning("reconcile of %s/%s failed (%s); retrying in %.1fs", *key, exc, delay)
                body = self.bodies.get(key)
                if body is not None and failures in (1, 5, 10):  # not an Event per retry
                    _post(body, "Warning", "ReconcileError", f"{exc} (retrying with backoff)")
                self.queue.add_after(key, delay)
            finally:
                self.queue.done(key)

    async def reconcile(self, key: Key) -> Plan | None:
        body = self.bodies.get(key)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        started = time.perf_counter()
        res = Resource.from_body(body)
        if key in self.written:
            res = Resource(res.name, res.namespace, res.uid, res.generation, res.spec, res.annotations,
                           self.written[key])
        claim, paths = _cache_of(res)
        observed = self.observe(res, claim, paths)
        await self._read_failed_pods(res.namespace, observed)
        result = plan(res, observed, now=now_rfc3339(), renderers=self.renderers,
                      targets=lambda spec, status: self.targets.get(key))
        # Claim builds before the first await: a concurrent reconcile of another resource sharing the
        # cache sees the claim and waits for this Job instead of starting its own.
        for claim_name, path, job in result.claims:
            self.claims[(res.namespace, claim_name, path)] = _Claim(job, res.name, time.monotonic())
        for manifest in result.create:
            created = await self.applier.create(manifest)
            if created and manifest["kind"] == "Job":
                self.metrics.builds.labels(manifest["metadata"]["labels"][names.LABEL_VARIANT], "started").inc()
        for manifest in result.apply:
            await self.applier.ensure(manifest)
        self.waiting[key] = {(claim, e["path"]) for e in result.status.get("engines", {}).values()
                             if e.get("state") == "Building"}
        current = {k: v for k, v in res.status.items() if k != "kopf"}
        patch = merge_patch(current, result.status)
        if patch:
            path = f"/apis/{GROUP}/{VERSION}/namespaces/{res.namespace}/{PLURAL}/{res.name}/status"
            try:
                await self.client.request("PATCH", path, {"status": patch}, content_type="application/merge-patch+json")
            except ApiError as exc:
                if exc.status == 404:  # deleted meanwhile
                    return result
                raise
            self.written[key] = result.status
        for ev in result.events:
            _post(body, ev.type, ev.reason, ev.message)
            if ev.reason in ("EngineReady", "EngineCached", "BuildFailed"):
                variant = ev.message.split(" ", 1)[0]
                self.metrics.builds.labels(variant, {"EngineReady": "succeeded", "EngineCached": "cached",
                                                     "BuildFailed": "failed"}[ev.reason]).inc()
            if ev.reason == "Switched":
                self.metrics.switches.labels(current.get("activeEngine", ""), result.status.get("activeEngine", "")).inc()
        self.metrics.set_phase(res.namespace, res.name, result.status.get("phase"))
        self.metrics.reconciles.labels("ok").inc()
        self.metrics.duration.observe(time.perf_counter() - started)
        return result


def _cache_of(res: Resource) -> tuple[str, dict[str, str]]:
    """The cache claim and the artifact path of each variant (from the valid spec; empty otherwise)."""
    from engine_jobs.contract import VARIANTS

    from ..api.engine_key import engine_key
    from ..render.build import artifact_path

    try:
        spec = ReDrafterDeploymentSpec.model_validate(dict(res.spec))
    except Exception:
        return "", {}
    return spec.engine.cache.claim_name, {v: artifact_path(spec, engine_key(spec, v)) for v in VARIANTS}


def _same_status(observed: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
    return merge_patch({k: v for k, v in observed.items() if k != "kopf"}, dict(written)) is None


def _reconcile_relevant(body: Mapping[str, Any]) -> Any:
    """What in a resource can change the plan: generation/spec, annotations, deletion (not our status)."""
    meta = body.get("metadata") or {}
    return (meta.get("generation"), body.get("spec"), meta.get("annotations", {}).get(names.ANNOTATION_RETRY_BUILD),
            meta.get("deletionTimestamp"), meta.get("uid"))


def _post(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """An Event on the resource (kopf's poster batches and retries them)."""
    try:
        if type_ == "Warning":
            kopf.warn(dict(body), reason=reason, message=message)
        else:
            kopf.info(dict(body), reason=reason, message=message)
    except LookupError:  # outside a running kopf operator (unit use): log only
        pass
    (log.warning if type_ == "Warning" else log.info)("%s/%s %s: %s", body.get("metadata", {}).get("namespace"),
                                                       body.get("metadata", {}).get("name"), reason, message)


@dataclass(frozen=True)
class Current:
    """A resource as an evaluator sees it: the newest body the watch delivered and the status the
    reconciler or an evaluator last wrote (which the watch may not have echoed yet)."""

    key: Key
    body: Mapping[str, Any]
    meta: Mapping[str, Any]
    spec: ReDrafterDeploymentSpec
    status: dict[str, Any]


def current_resource(controller: Any, body: Mapping[str, Any]) -> Current | None:
    """The resource now, or None while it is being deleted or its spec is invalid (the reconciler says why)."""
    meta = body.get("metadata") or {}
    key: Key = (meta.get("namespace") or "default", meta.get("name", ""))
    body = controller.bodies.get(key) or body
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    try:
        spec = ReDrafterDeploymentSpec.model_validate(dict(body.get("spec") or {}))
    except ValidationError:
        return None
    return Current(key, body, meta, spec, dict(controller.written.get(key) or body.get("status") or {}))


async def write_status(controller: Any, key: Key, patch: Mapping[str, Any]) -> None:
    """An evaluator's merge patch of ``status`` (a deleted resource is not an error; others raise ApiError).

    The reconciler plans from its last written status until the watch echoes it, so the response
    becomes that view: its next status patch then keeps what the evaluator wrote.
    """
    ns, name = key
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/{name}/status"
    try:
        resp = await controller.client.request("PATCH", path, {"status": dict(patch)},
                                               content_type="application/merge-patch+json")
    except ApiError as exc:
        if exc.status == 404:
            return
        raise
    written = {k: v for k, v in (resp.get("status") or {}).items() if k != "kopf"}
    if written and key in controller.bodies:
        controller.written[key] = written


def post_events(controller: Any, body: Mapping[str, Any], events: Iterable[tuple[str, str, str]]) -> None:
    """Events (type, reason, message) from an evaluator, through kopf's queue (see adopt_posting_context)."""
    for var, value in getattr(controller, "_posting_vars", ()):
        var.set(value)
    for type_, reason, message in events:
        _post(body, type_, reason, message)


# ---- kopf registration -------------------------------------------------------------------------
def register(registry: kopf.OperatorRegistry, make_controller: Callable[[], Awaitable[Controller]],
             configure: Callable[[kopf.OperatorSettings], None] | None = None) -> None:
    """Register every handler into ``registry`` (a fresh one per run keeps test runs independent)."""

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
        settings.posting.level = logging.INFO
        settings.persistence.finalizer = f"{names.DOMAIN}/kopf-finalizer"  # unused: no handler needs one
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.error_backoffs = [1, 2, 5, 10]
        if configure:
            configure(settings)
        controller = await make_controller()
        controller.indexes = {k: v for k, v in kwargs.items() if k.startswith("rdd_")}
        memo.controller = controller
        await controller.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        controller = getattr(memo, "controller", None)
        if controller is not None:
            await controller.stop()

    @kopf.index("batch", "v1", "jobs", labels=BUILD, registry=registry, id="rdd_jobs")
    def rdd_jobs(body: kopf.Body, **_: Any) -> dict[Any, JobFact]:
        job = JobFact.from_body(body)
        return {("owner", job.namespace, job.owner): job, ("name", job.namespace, job.name): job,
                ("artifact", job.namespace, job.claim, job.artifact): job}

    @kopf.index("", "v1", "pods", labels=BUILD, registry=registry, id="rdd_build_pods")
    def rdd_build_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[Any, PodFact]:
        pod = PodFact.from_body(body)
        return {(namespace, pod.job): pod} if pod.job else {}

    @kopf.index("apps", "v1", "deployments", labels=MANAGED, registry=registry, id="rdd_deployments")
    def rdd_deployments(body: kopf.Body, namespace: str, **_: Any) -> dict[Any, DeploymentFact]:
        dep = DeploymentFact.from_body(body)
        owner = (body.get("metadata", {}).get("labels") or {}).get(names.LABEL_DEPLOYMENT, "")
        return {("owner", namespace, owner): dep, ("name", namespace, dep.name): dep}

    @kopf.index("", "v1", "services", labels=MANAGED, registry=registry, id="rdd_services")
    def rdd_services(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[Any, ObjectFact]:
        return {("name", namespace, name): ObjectFact.from_body(body)}

    @kopf.index("", "v1", "configmaps", labels=MANAGED, registry=registry, id="rdd_configmaps")
    def rdd_configmaps(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[Any, ObjectFact]:
        return {("name", namespace, name): ObjectFact.from_body(body)}

    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="rdd_ready")
    def rdd_ready(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[Any, str]:
        """Artifacts a resource's status shows Ready: they outlive the Jobs that built them."""
        claim = ((body.get("spec") or {}).get("engine") or {}).get("cache", {}).get("claimName", "engine-cache")
        engines = (body.get("status") or {}).get("engines") or {}
        return {(namespace, claim, e["path"]): name for e in engines.values()
                if isinstance(e, dict) and e.get("state") in ("Ready", "Cached") and e.get("path")}

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="rdd_event")
    def rdd_event(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
        memo.controller.adopt_posting_context()
        memo.controller.on_resource_event(event.get("type"), event["object"])

    def child_event(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
        memo.controller.on_child_event(event["object"], event.get("type"))

    kopf.on.event("batch", "v1", "jobs", labels=BUILD, registry=registry, id="job_event")(child_event)
    kopf.on.event("", "v1", "pods", labels=BUILD, registry=registry, id="build_pod_event")(child_event)
    kopf.on.event("apps", "v1", "deployments", labels=MANAGED, registry=registry, id="deployment_event")(child_event)
    kopf.on.event("", "v1", "services", labels=MANAGED, registry=registry, id="service_event")(child_event)
    kopf.on.event("", "v1", "configmaps", labels=MANAGED, registry=registry, id="configmap_event")(child_event)


def interval_of(body: Mapping[str, Any]) -> float:
    """spec.speculation.interval in seconds (30 s when unset or invalid) — for evaluators."""
    try:
        return parse_duration(((body.get("spec") or {}).get("speculation") or {}).get("interval", "30s"))
    except ValueError:
        return 30.0


__all__ = ["Controller", "ControllerSettings", "Evaluator", "WorkQueue", "interval_of", "register"]
