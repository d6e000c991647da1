"""The reconciler: the controller's process-wide state, its workers and the one reconcile of a resource.

Shape (controller-runtime style, on kopf; the kopf registration is :mod:`.handlers`):
  * kopf's watch events only enqueue the owning resource (and resources waiting for the same shared
    artifact); :class:`~.workqueue.WorkQueue` deduplicates them.
  * N workers take resources from the queue (one at a time per resource), observe the children from
    the indexes (:mod:`.observe`), call the pure planner, create-or-patch children, patch status only
    when it changed, post Events. Errors requeue the resource with exponential backoff; a periodic
    resync catches missed events.
  * Policy seam: ``Controller.set_targets`` (desired active engine + replicas per variant, applied
    blue/green by the planner) and ``Controller.add_evaluator`` (a per-resource timer slot); the
    evaluators reach the controller only through :class:`~.resource_io.Host`.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..api import KIND
from ..render import names
from .apply import ApiError, Applier, ChildState, KubeClient, merge_patch
from .facts import DeploymentFact, JobFact, Observed
from .metrics import OperatorMetrics
from .observe import BuildClaim, ClaimRef, FailedPodMessages, cache_of, child_state, observe
from .plan_types import EventSpec, Plan, Renderers, Resource, ServingTargets
from .planner import plan
from .resource_io import Evaluator, Key, index_entries, now_rfc3339, post_event, status_path
from .routing import CRD_MISSING_MESSAGE, crd_missing
from .workqueue import WorkQueue

log = logging.getLogger("redrafter_operator.controller")

MAX_BACKOFF = 300.0


@dataclass
class ControllerSettings:
    workers: int = 4
    resync_seconds: float = 300.0
    claim_seconds: float = 120.0  # how long an in-flight build claim is trusted before its Job is seen
    evaluations: int = 32  # evaluations of one evaluator in flight at once (each for a different resource)


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
        self.claims: dict[ClaimRef, BuildClaim] = {}  # builds started here, until their Job is seen
        self.written: dict[Key, dict[str, Any]] = {}  # last status written, until the watch echoes it
        self.targets: dict[Key, ServingTargets] = {}
        self.waiting: dict[Key, set[tuple[str, str]]] = {}  # resource -> {(claim, path)} it waits for
        self._waiters: dict[tuple[str, str, str], set[Key]] = {}  # (namespace, claim, path) -> who waits
        self._by_label: dict[tuple[str, str], set[Key]] = {}  # (namespace, owner label value) -> resources
        self.failures: dict[Key, int] = {}
        self.evaluators: list[Evaluator] = []
        self._next_eval: dict[tuple[Key, int], float] = {}
        self._evaluating: set[tuple[Key, int]] = set()  # (resource, evaluator) slots in flight
        self._eval_slots: dict[int, asyncio.Semaphore] = {}
        self._eval_tasks: set[asyncio.Task[None]] = set()
        self.applier = Applier(self.client, lambda manifest: child_state(self.indexes, manifest))
        self._tasks: list[asyncio.Task[None]] = []
        self.failed_pods = FailedPodMessages(self.client)
        self._locks: dict[Key, asyncio.Lock] = {}
        self.posting_vars: list[tuple[contextvars.ContextVar[Any], Any]] = []

    def adopt_posting_context(self) -> None:
        """Remember kopf's Event-posting queue, which kopf only exposes inside its handlers' context.

        kopf.info/warn find their queue through context variables set per watched object; our workers
        run outside those tasks, so they adopt the variables captured from a handler (once).
        """
        if not self.posting_vars:
            self.posting_vars = [
                (var, value)
                for var, value in contextvars.copy_context().items()
                if var.name in ("event_queue_var", "event_queue_loop_var")
            ]

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

    # ---- queueing ---------------------------------------------------------------------------
    def on_resource_event(self, event_type: str | None, raw: Mapping[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name", ""))
        if event_type == "DELETED":
            if self.bodies.pop(key, None) is not None:
                _discard(self._by_label, (key[0], names.label_value(key[1])), key)
            self.written.pop(key, None)
            self.targets.pop(key, None)
            self._set_waiting(key, set())
            self.failures.pop(key, None)
            lock = self._locks.get(key)
            if lock is not None and not lock.locked():
                del self._locks[key]
            self.metrics.forget_resource(*key)
            self.applier.forget(key[0])
            self.failed_pods.forget(key[0], key[1])
            self.metrics.resources.set(len(self.bodies))
            return
        body = copy.deepcopy(dict(raw))
        written = self.written.get(key)
        if written is not None and _same_status(body.get("status") or {}, written):
            self.written.pop(key, None)  # the watch caught up with our last write
        old = self.bodies.get(key)
        self.bodies[key] = body
        if old is None:
            self._by_label.setdefault((key[0], names.label_value(key[1])), set()).add(key)
        for i, ev in enumerate(self.evaluators):
            if getattr(ev, "wakes_on_change", False):  # due at the next tick (it is not running twice at once)
                self._next_eval.pop((key, i), None)
        self.metrics.resources.set(len(self.bodies))
        if old is None or _reconcile_relevant(old) != _reconcile_relevant(body):
            self.queue.add(key)

    def on_child_event(self, raw: Mapping[str, Any], deleted: bool = False) -> None:
        meta = raw.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        if deleted and raw.get("kind") and meta.get("name"):
            self.applier.deleted({**raw, "metadata": {**meta, "namespace": ns}})
        owners = [r.get("name") for r in meta.get("ownerReferences") or [] if r.get("kind") in (KIND, "Job")]
        for name in owners:
            if (ns, name) in self.bodies:
                self.queue.add((ns, name))
            else:  # a build Pod: its owner is a Job, whose owner is the resource
                for job in index_entries(self.indexes, "rdd_jobs", ("name", ns, name)):
                    self._enqueue_owner(ns, job.owner)
        labels = meta.get("labels") or {}
        if raw.get("kind") == "Pod" and labels.get(names.LABEL_COMPONENT) == "serving":
            self._enqueue_owner(ns, labels.get(names.LABEL_DEPLOYMENT, ""))  # owned by a ReplicaSet, not by us
        if raw.get("kind") == "Job":
            job = JobFact.from_body(raw)
            for key in self._waiters.get((ns, job.claim, job.artifact), ()):
                self.queue.add(key)

    def _enqueue_owner(self, ns: str, owner_label: str) -> None:
        for key in self._by_label.get((ns, owner_label), ()):
            self.queue.add(key)

    def _set_waiting(self, key: Key, waits: set[tuple[str, str]]) -> None:
        """Which artifacts (claim, path) ``key`` waits for, and the reverse map a Job event looks up."""
        for claim, path in self.waiting.pop(key, set()) - waits:
            _discard(self._waiters, (key[0], claim, path), key)
        for claim, path in waits:
            self._waiters.setdefault((key[0], claim, path), set()).add(key)
        if waits:
            self.waiting[key] = waits

    def _fill_applied(self, namespace: str, observed: Observed) -> None:
        """Which manifest each observed Deployment carries, as far as this process's applies tell."""
        observed.applied = {d.name: _carried(self.applier, namespace, d) for d in observed.deployments.values()}

    # ---- the loop ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._worker(i), name=f"redrafter-worker-{i}") for i in range(self.settings.workers)
        ]
        self._tasks.append(asyncio.create_task(self._ticker(), name="redrafter-ticker"))

    async def stop(self) -> None:
        self.queue.close()
        tasks = [*self._tasks, *self._eval_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self._eval_tasks.clear()
        self._evaluating.clear()
        await self.client.close()

    async def _ticker(self) -> None:
        """Periodic resync (missed events) and the per-resource evaluator slots.

        Each due (resource, evaluator) slot runs as its own task, at most ``settings.evaluations`` per
        evaluator at once and never twice at once for the same slot: an evaluation that waits (a metrics
        scrape up to its timeout, an API call) delays neither the other resources nor the other evaluators,
        so the time for every resource to be evaluated does not grow with the number of resources."""
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
                    slot = (key, i)
                    if slot in self._evaluating or now < self._next_eval.get(slot, 0.0):
                        continue
                    try:
                        self._next_eval[slot] = now + max(1.0, ev.interval(body))
                    except Exception:  # an evaluator's bug must not stop serving reconciles
                        log.exception("evaluator %s failed for %s/%s", type(ev).__name__, *key)
                        continue
                    self._evaluating.add(slot)
                    task = asyncio.create_task(
                        self._evaluate(ev, slot, body), name=f"redrafter-evaluate-{i}-{key[0]}/{key[1]}"
                    )
                    self._eval_tasks.add(task)
                    task.add_done_callback(self._eval_tasks.discard)

    async def _evaluate(self, ev: Evaluator, slot: tuple[Key, int], body: Mapping[str, Any]) -> None:
        """One evaluation of one resource (holding the resource's lock: see :meth:`lock`)."""
        key, i = slot
        slots = self._eval_slots.get(i)
        if slots is None:
            slots = self._eval_slots[i] = asyncio.Semaphore(max(1, self.settings.evaluations))
        try:
            async with slots:
                if key not in self.bodies:  # deleted while it waited for a slot
                    return
                async with self.lock(key):
                    await ev.evaluate(self, body)
        except asyncio.CancelledError:
            raise
        except Exception:  # an evaluator's bug must not stop serving reconciles
            log.exception("evaluator %s failed for %s/%s", type(ev).__name__, *key)
        finally:
            self._evaluating.discard(slot)

    async def _worker(self, n: int) -> None:
        while True:
            key = await self.queue.get()
            for var, value in self.posting_vars:
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
                    post_event(body, "Warning", "ReconcileError", f"{exc} (retrying with backoff)")
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
            res = Resource(
                res.name, res.namespace, res.uid, res.generation, res.spec, res.annotations, self.written[key]
            )
        claim, paths = cache_of(res)
        observed = observe(
            self.indexes,
            res,
            claim,
            paths,
            self.claims,
            claim_seconds=self.settings.claim_seconds,
            now=time.monotonic(),
        )
        await self.failed_pods.fill(res.namespace, observed)
        self._fill_applied(res.namespace, observed)
        result = plan(
            res,
            observed,
            now=now_rfc3339(),
            renderers=self.renderers,
            targets=lambda spec, status: self.targets.get(key),
        )
        # Claim builds before the first await: a concurrent reconcile of another resource sharing the
        # cache sees the claim and waits for this Job instead of starting its own.
        for claim_name, path, job in result.claims:
            self.claims[(res.namespace, claim_name, path)] = BuildClaim(job, res.name, time.monotonic())
        for manifest in result.create:
            created = await self.applier.create(manifest)
            if created and manifest["kind"] == "Job":
                self.metrics.builds.labels(manifest["metadata"]["labels"][names.LABEL_VARIANT], "started").inc()
        replan = pool_missing = False
        for manifest in result.apply:
            try:
                sent = await self.applier.ensure(manifest)
            except ApiError as exc:
                # An API the cluster does not serve answers 404 to the write: only the optional InferencePool
                # may be missing; say so in status (and an Event) instead of failing the whole reconcile.
                if exc.status != 404 or manifest["kind"] != "InferencePool":
                    raise
                pool_missing = True
                continue
            replan = replan or (sent and manifest["kind"] == "Deployment")
        if replan:
            # The status was planned before these applies; their answers say whether each Deployment already
            # carried its manifest (an apply that changed nothing, e.g. the first one after a restart) or
            # now rolls out a new template. Plan again (pure; the children are the same) for the status.
            self._fill_applied(res.namespace, observed)
            again = plan(
                res,
                observed,
                now=now_rfc3339(),
                renderers=self.renderers,
                targets=lambda spec, status: self.targets.get(key),
            )
            result.status, result.events = again.status, again.events
        if pool_missing:
            result.status, news = crd_missing(res.status, result.status, generation=res.generation, now=now_rfc3339())
            if news:
                result.events.append(EventSpec("Warning", "InferencePoolCRDMissing", CRD_MISSING_MESSAGE))
        for manifest in result.delete:
            await self.applier.delete(manifest)
        self._set_waiting(
            key, {(claim, e["path"]) for e in result.status.get("engines", {}).values() if e.get("state") == "Building"}
        )
        current = {k: v for k, v in res.status.items() if k != "kopf"}
        patch = merge_patch(current, result.status)
        if patch:
            try:
                await self.client.request(
                    "PATCH",
                    status_path(res.namespace, res.name),
                    {"status": patch},
                    content_type="application/merge-patch+json",
                )
            except ApiError as exc:
                if exc.status == 404:  # deleted meanwhile
                    return result
                raise
            self.written[key] = result.status
        for ev in result.events:
            post_event(body, ev.type, ev.reason, ev.message)
            if ev.reason in ("EngineReady", "EngineCached", "BuildFailed"):
                variant = ev.message.split(" ", 1)[0]
                self.metrics.builds.labels(
                    variant, {"EngineReady": "succeeded", "EngineCached": "cached", "BuildFailed": "failed"}[ev.reason]
                ).inc()
            if ev.reason == "Switched":
                self.metrics.switches.labels(
                    res.namespace, res.name, current.get("activeEngine", ""), result.status.get("activeEngine", "")
                ).inc()
        self.metrics.observe_resource(res.namespace, res.name, res.spec, result.status)
        self.metrics.reconciles.labels("ok").inc()
        self.metrics.duration.observe(time.perf_counter() - started)
        return result


def _discard(index: dict[Any, set[Key]], ref: Any, key: Key) -> None:
    keys = index.get(ref)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[ref]


def _carried(applier: Applier, namespace: str, dep: DeploymentFact) -> str:
    return applier.carried(
        "Deployment", namespace, dep.name, dep.generation, ChildState(dep.resource_version, dep.owned_fields)
    )


def _same_status(observed: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
    return merge_patch({k: v for k, v in observed.items() if k != "kopf"}, dict(written)) is None


def _reconcile_relevant(body: Mapping[str, Any]) -> Any:
    """What in a resource can change the plan: generation/spec, annotations, deletion (not our status)."""
    meta = body.get("metadata") or {}
    return (
        meta.get("generation"),
        body.get("spec"),
        meta.get("annotations", {}).get(names.ANNOTATION_RETRY_BUILD),
        meta.get("deletionTimestamp"),
        meta.get("uid"),
    )


__all__ = ["Controller", "ControllerSettings"]
