"""The reconciler: the controller's process-wide state, its workers and the one reconcile of a resource.

Shape (controller-runtime style, on kopf; the kopf registration is :mod:`.handlers`):
  * kopf's watch events only enqueue the owning resource (every child kind is watched and indexed:
    controller-runtime's ``Owns()``); :class:`~.workqueue.WorkQueue` deduplicates them.
  * N workers take resources from the queue (one at a time per resource), observe the children from
    the indexes (:mod:`.observe`), call the pure planner with the monitors' newest reports, apply the
    children, patch status once and only when it changed, post the Events. This is the only code that
    writes to the API (status, children, Events). Errors requeue the resource with exponential backoff;
    a periodic resync catches missed events.
  * Monitors (:mod:`.speculation`, :mod:`.retention`) run on the ticker's slots and hand typed reports
    over (:meth:`Controller.hand_over`), which wakes the resource when a report changed.
  * Time comes from one injectable :class:`~.clock.Clock`: tests move it instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, MutableMapping

from ..api import KIND
from ..api.engine_key import engine_keys
from ..api.spec import ReDrafterDeploymentSpec, parse_spec
from ..render import names
from ..render.placement import Node
from .apply import ApiError, Applier, ChildState, KubeClient, merge_patch, object_path
from .clock import Clock, SystemClock
from .facts import DeploymentFact, JobFact, Observed
from .metrics import OperatorMetrics
from .observe import BuildClaim, ClaimRef, FailedPodMessages, cache_of, child_state, observe
from .plan_types import EventSpec, Plan, Renderers, Resource, ServingTargets
from .planner import Inputs, decide, explain
from .reports import RetentionReport, SpeculationReport, TrainingReport
from .resource_io import Monitor, index_entries, now_rfc3339, post_event, status_path
from .workqueue import ResourceKey, WorkQueue

log = logging.getLogger("redrafter_operator.controller")

MAX_BACKOFF = 300.0
#: a child's apply answered with one of these will not succeed by retrying alone (400 BadRequest, 403 Forbidden,
#: 422 Invalid): someone must change the spec, the RBAC or a conflicting object
REFUSED = frozenset({400, 403, 422})


class ChildrenRefused(Exception):
    """The API server refused the apply of some children (the status's ``ApplyRefused`` stall names them)."""


@dataclass
class ControllerSettings:
    workers: int = 4
    resync_seconds: float = 300.0
    claim_seconds: float = 120.0  # how long an in-flight build claim is trusted before its Job is seen
    runs: int = 32  # runs of one monitor in flight at once (each for a different resource)


@dataclass
class Tracked:
    """What the controller keeps of one resource, in one record dropped at once when the resource is deleted."""

    body: dict[str, Any]  # newest body, as the watch delivered it
    #: (raw spec, parsed spec or None, its errors, engine keys), redone when the raw spec changes
    parsed: tuple[Any, ReDrafterDeploymentSpec | None, list[str], dict[str, str]] | None = None
    written: dict[str, Any] | None = None  # last status written, until the watch echoes it
    inputs: Inputs = field(default_factory=Inputs)  # the monitors' newest reports (and targets set by hand)
    events: list[EventSpec] = field(default_factory=list)  # handed over, posted by the next reconcile
    annotate: list[tuple[dict[str, Any], dict[str, str]]] = field(default_factory=list)  # handed over, likewise
    waiting: set[tuple[str, str]] = field(default_factory=set)  # {(claim, path)} of the builds it waits for
    unplaced: bool = False  # a GPU Job no node could run at its last plan
    failures: int = 0  # reconciles failed in a row (the backoff)


class _Bodies(MutableMapping[ResourceKey, dict[str, Any]]):
    """The newest body of each tracked resource (what a monitor reads), a view of the records."""

    def __init__(self, records: dict[ResourceKey, Tracked]) -> None:
        self._records = records

    def __getitem__(self, key: ResourceKey) -> dict[str, Any]:
        return self._records[key].body

    def __setitem__(self, key: ResourceKey, body: dict[str, Any]) -> None:
        record = self._records.get(key)
        if record is None:
            self._records[key] = Tracked(body)
        else:
            record.body = body

    def __delitem__(self, key: ResourceKey) -> None:
        del self._records[key]

    def __iter__(self) -> Iterator[ResourceKey]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)


class _Written(Mapping[ResourceKey, dict[str, Any]]):
    """The status last written of each resource whose watch has not echoed it yet, a view of the records."""

    def __init__(self, records: dict[ResourceKey, Tracked]) -> None:
        self._records = records

    def __getitem__(self, key: ResourceKey) -> dict[str, Any]:
        written = self._records[key].written
        if written is None:
            raise KeyError(key)
        return written

    def __iter__(self) -> Iterator[ResourceKey]:
        return (k for k, r in self._records.items() if r.written is not None)

    def __len__(self) -> int:
        return sum(1 for r in self._records.values() if r.written is not None)


@dataclass
class Controller:
    """Process-wide state of one running operator (kept in kopf's memo)."""

    client: KubeClient
    renderers: Renderers
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    settings: ControllerSettings = field(default_factory=ControllerSettings)
    clock: Clock = field(default_factory=SystemClock)

    def __post_init__(self) -> None:
        self.resources: dict[ResourceKey, Tracked] = {}  # one record per resource
        self.bodies = _Bodies(self.resources)
        self.written = _Written(self.resources)
        self.queue = WorkQueue(self.clock)
        self.indexes: Mapping[str, Any] = {}
        self.claims: dict[ClaimRef, BuildClaim] = {}  # builds started here, until their Job is seen
        self._waiters: dict[tuple[str, str, str], set[ResourceKey]] = {}  # (namespace, claim, path) -> who waits
        self._by_label: dict[tuple[str, str], set[ResourceKey]] = {}  # (namespace, owner label value) -> resources
        self._nodes: dict[str, Node] = {}  # what placement last read of each Node
        self.monitors: list[Monitor] = []
        self._next_run: dict[tuple[ResourceKey | None, int], float] = {}
        self._running: set[tuple[ResourceKey | None, int]] = set()  # (resource or None, monitor) slots in flight
        self._run_slots: dict[int, asyncio.Semaphore] = {}
        self._run_tasks: set[asyncio.Task[None]] = set()
        self.applier = Applier(
            self.client, lambda manifest: child_state(self.indexes, manifest), monotonic=self.clock.monotonic
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.failed_pods = FailedPodMessages(self.client)
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

    # ---- what the monitors see and hand over ------------------------------------------------------
    def spec_of(self, key: ResourceKey) -> ReDrafterDeploymentSpec | None:
        """The resource's spec, parsed once per change of the raw spec (None when invalid or unknown)."""
        body = self.bodies.get(key)
        if body is None:
            return None
        return self._parsed(key, body)[0]

    def engine_keys_of(self, key: ResourceKey) -> dict[str, str]:
        """Each variant's engine key, computed once per change of the spec ({} when invalid or unknown)."""
        body = self.bodies.get(key)
        return self._parsed(key, body)[2] if body is not None else {}

    def _parsed(
        self, key: ResourceKey, body: Mapping[str, Any]
    ) -> tuple[ReDrafterDeploymentSpec | None, list[str], dict[str, str]]:
        raw = body.get("spec") or {}
        record = self.resources.get(key)
        cached = record.parsed if record else None
        if cached is None or cached[0] != raw:
            spec, errors = parse_spec(dict(raw))
            cached = (copy.deepcopy(raw), spec, errors, engine_keys(spec))
            if record is not None:
                record.parsed = cached
        return cached[1], cached[2], cached[3]

    def hand_over(self, key: ResourceKey, report: Any) -> None:
        """A monitor's newest report; its Events and annotations wait for the next reconcile, which is woken
        when the report changes what that reconcile would plan."""
        record = self.resources.get(key)
        if record is None:
            return
        events = list(getattr(report, "events", ()) or ())
        annotate = list(getattr(report, "annotate", ()) or ())
        record.events += events
        record.annotate += annotate
        old = record.inputs
        if isinstance(report, SpeculationReport):
            new = replace(old, speculation=replace(report, events=()))
        elif isinstance(report, RetentionReport):
            new = replace(old, retention=replace(report, events=(), annotate=()))
        elif isinstance(report, TrainingReport):
            new = replace(old, training=report)
        else:
            raise TypeError(f"unknown report {type(report).__name__}")
        record.inputs = new
        if new != old or events or annotate:
            self.queue.add(key)

    def set_targets(self, namespace: str, name: str, targets: ServingTargets | None) -> None:
        """Ask for an active engine + replicas per variant by hand (over the policy's); the next reconcile
        applies it blue/green through the validation gate."""
        key = (namespace, name)
        record = self.resources.get(key)
        if record is not None and record.inputs.targets != targets:
            record.inputs = replace(record.inputs, targets=targets)
            self.queue.add(key)

    def add_monitor(self, monitor: Monitor) -> None:
        self.monitors.append(monitor)

    def idle(self) -> bool:
        """Nothing queued, reconciling or monitoring right now (what a test settles on, instead of sleeping)."""
        return self.queue.idle() and not self._running

    # ---- queueing ---------------------------------------------------------------------------
    def on_resource_event(self, event_type: str | None, raw: Mapping[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name", ""))
        if event_type == "DELETED":
            if key in self.resources:
                _discard(self._by_label, (key[0], names.label_value(key[1])), key)
                self._set_waiting(key, set())
                del self.resources[key]
            for monitor in self.monitors:
                monitor.forget(key)
            self.metrics.forget_resource(*key)
            self.applier.forget(key[0])
            self.failed_pods.forget(key[0], key[1])
            self.metrics.resources.set(len(self.bodies))
            return
        body = copy.deepcopy(dict(raw))
        record = self.resources.get(key)
        old = record.body if record else None
        if record is None:
            record = self.resources[key] = Tracked(body)
        else:
            record.body = body
        if record.written is not None and _same_status(body.get("status") or {}, record.written):
            record.written = None  # the watch caught up with our last write
        if old is None:
            self._by_label.setdefault((key[0], names.label_value(key[1])), set()).add(key)
        self.metrics.resources.set(len(self.bodies))
        if old is None or _reconcile_relevant(old) != _reconcile_relevant(body):
            self.queue.add(key)
        if old is not None and (old.get("metadata") or {}).get("generation") != meta.get("generation"):
            # a new spec (a pinned speculation mode, new thresholds, replicas): the monitors judge it at the
            # next tick instead of at the end of their interval, so the policy's decision follows at once
            self._monitors_soon(key)

    def _monitors_soon(self, key: ResourceKey) -> None:
        """Run the resource's monitors at the next tick (what they last judged has changed)."""
        for slot in self._next_run:
            if slot[0] == key:
                self._next_run[slot] = 0.0

    def on_child_event(self, raw: Mapping[str, Any], deleted: bool = False) -> None:
        meta = raw.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        if deleted and raw.get("kind") and meta.get("name"):
            self.applier.deleted({**raw, "metadata": {**meta, "namespace": ns}})
        owners = [r.get("name") for r in meta.get("ownerReferences") or [] if r.get("kind") in (KIND, "Job")]
        for name in owners:
            if (ns, name) in self.bodies:
                self.queue.add((ns, name))
            else:  # a build or validation Pod: its owner is a Job, whose owner is the resource
                for index in ("rdd_jobs", "rdd_validation_jobs"):
                    for job in index_entries(self.indexes, index, ("name", ns, name)):
                        self._enqueue_owner(ns, job.owner)
        labels = meta.get("labels") or {}
        if raw.get("kind") == "Pod" and labels.get(names.LABEL_COMPONENT) == "serving":
            self._enqueue_owner(ns, labels.get(names.LABEL_DEPLOYMENT, ""))  # owned by a ReplicaSet, not by us
        if raw.get("kind") == "Job":
            job = JobFact.from_body(raw)
            for key in self._waiters.get((ns, job.claim, job.artifact), ()):
                self.queue.add(key)

    def on_node_event(self, raw: Mapping[str, Any], deleted: bool = False) -> None:
        """A Node changed what placement reads (labels, allocatable, taints, cordon), or came or went: the
        resources waiting for a node are planned again. Heartbeats and other status churn wake nothing."""
        node = Node.from_body(raw)
        if deleted:
            changed = self._nodes.pop(node.name, None) is not None
        else:
            changed = self._nodes.get(node.name) != node
            self._nodes[node.name] = node
        if changed:
            for key in [k for k, r in self.resources.items() if r.unplaced]:
                self.queue.add(key)

    def _enqueue_owner(self, ns: str, owner_label: str) -> None:
        for key in self._by_label.get((ns, owner_label), ()):
            self.queue.add(key)

    def _set_waiting(self, key: ResourceKey, waits: set[tuple[str, str]]) -> None:
        """Which artifacts (claim, path) ``key`` waits for, and the reverse map a Job event looks up."""
        record = self.resources.get(key)
        if record is None:
            return
        for claim, path in record.waiting - waits:
            _discard(self._waiters, (key[0], claim, path), key)
        for claim, path in waits:
            self._waiters.setdefault((key[0], claim, path), set()).add(key)
        record.waiting = waits

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
        tasks = [*self._tasks, *self._run_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self._run_tasks.clear()
        self._running.clear()
        await self.client.close()

    async def _ticker(self) -> None:
        """Periodic resync (missed events) and the monitors' slots, once a second on the controller's clock.

        Each due (resource, monitor) slot runs as its own task, at most ``settings.runs`` per monitor at once
        and never twice at once for the same slot: a run that waits (a metrics scrape up to its timeout)
        delays neither the other resources nor the other monitors."""
        last_resync = self.clock.monotonic()
        while True:
            await self.clock.sleep(1.0)
            self.metrics.queue_depth.set(len(self.queue))
            now = self.clock.monotonic()
            if now - last_resync >= self.settings.resync_seconds:
                last_resync = now
                for key in list(self.bodies):
                    self.queue.add(key)
                for ref in [r for r, c in self.claims.items() if now - c.at > self.settings.claim_seconds]:
                    del self.claims[ref]
                for slot in [s for s in self._next_run if s[0] is not None and s[0] not in self.bodies]:
                    del self._next_run[slot]
            for i, monitor in enumerate(self.monitors):
                due: list[ResourceKey | None] = [*self.bodies] if monitor.per_resource else [None]
                for who in due:
                    slot = (who, i)
                    if slot in self._running or now < self._next_run.get(slot, 0.0):
                        continue
                    try:
                        self._next_run[slot] = now + max(1.0, monitor.interval(self, who))
                    except Exception:  # a monitor's bug must not stop serving reconciles
                        log.exception("monitor %s failed for %s", type(monitor).__name__, who)
                        continue
                    self._running.add(slot)
                    task = asyncio.create_task(self._run(monitor, slot), name=f"redrafter-monitor-{i}-{who}")
                    self._run_tasks.add(task)
                    task.add_done_callback(self._run_tasks.discard)

    async def _run(self, monitor: Monitor, slot: tuple[ResourceKey | None, int]) -> None:
        key, i = slot
        slots = self._run_slots.get(i)
        if slots is None:
            slots = self._run_slots[i] = asyncio.Semaphore(max(1, self.settings.runs))
        try:
            async with slots:
                if key is not None and key not in self.bodies:  # deleted while it waited for a slot
                    return
                await monitor.run(self, key)
                self.metrics.monitor_runs.labels(type(monitor).__name__).inc()
        except asyncio.CancelledError:
            raise
        except Exception:  # a monitor's bug must not stop serving reconciles
            log.exception("monitor %s failed for %s", type(monitor).__name__, key)
        finally:
            self._running.discard(slot)

    async def _worker(self, n: int) -> None:
        while True:
            key = await self.queue.get()
            for var, value in self.posting_vars:
                var.set(value)
            try:
                await self.reconcile(key)
                if key in self.resources:
                    self.resources[key].failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                record = self.resources.get(key)
                failures = (record.failures if record else 0) + 1
                if record is not None:
                    record.failures = failures
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

    async def reconcile(self, key: ResourceKey) -> Plan | None:
        """Observe, plan, apply the children, patch status once if it changed, post the Events."""
        record = self.resources.get(key)
        if record is None or (record.body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        body = record.body
        started = time.perf_counter()
        res = Resource.from_body(body)
        if record.written is not None:
            res = Resource(res.name, res.namespace, res.uid, res.generation, res.spec, res.annotations, record.written)
        spec, errors, keys = self._parsed(key, body)
        claim, paths = cache_of(spec, keys)
        observed = observe(
            self.indexes,
            res,
            claim,
            paths,
            self.claims,
            claim_seconds=self.settings.claim_seconds,
            now=self.clock.monotonic(),
        )
        await self.failed_pods.fill(res.namespace, observed)
        await self.failed_pods.fill_validation(res.namespace, observed)
        self._fill_applied(res.namespace, observed)
        inputs = record.inputs
        step = decide(
            res,
            observed,
            now=now_rfc3339(self.clock),
            renderers=self.renderers,
            spec=spec,
            errors=errors,
            inputs=inputs,
            engine_keys=keys,
        )
        result = step.plan
        # Claim builds before the first await: a concurrent reconcile of another resource sharing the
        # cache sees the claim and waits for this Job instead of starting its own.
        for claim_name, path, job in result.claims:
            self.claims[(res.namespace, claim_name, path)] = BuildClaim(job, res.name, self.clock.monotonic())
        for manifest in result.create:
            created = await self.applier.create(manifest)
            variant = (manifest["metadata"].get("labels") or {}).get(names.LABEL_VARIANT)
            if created and manifest["kind"] == "Job" and variant:  # a build Job
                self.metrics.builds.labels(variant, "started").inc()
        for manifest in result.apply:
            try:
                await self.applier.ensure(manifest)
            except ApiError as exc:
                # An API the cluster does not serve answers 404 to the write: only the optional InferencePool
                # may be missing; its condition says so instead of failing the whole reconcile.
                if exc.status == 404 and manifest["kind"] == "InferencePool":
                    observed.routing_api_missing = True
                elif exc.status in REFUSED:  # the other children still apply; the status names this one
                    meta = manifest["metadata"]
                    observed.refused.append(
                        f"{manifest['kind']} {meta['name']}: {exc.status} {exc.reason}: {exc.message}"
                    )
                else:
                    raise
        # The applies' answers are facts for the status: whether each Deployment now carries its manifest
        # (an apply that changed nothing, e.g. the first one after a restart) or rolls out a new template.
        self._fill_applied(res.namespace, observed)
        result = explain(step, observed)
        for manifest in result.delete:
            await self.applier.delete(manifest)
        annotate = [*result.annotate, *record.annotate]
        record.annotate = []
        for i, (ref, marks) in enumerate(annotate):
            try:
                await self.client.request(
                    "PATCH",
                    object_path(ref),
                    {"metadata": {"annotations": marks}},
                    content_type="application/merge-patch+json",
                )
            except ApiError as exc:
                if exc.status != 404:  # gone already: nothing to mark
                    record.annotate[:0] = annotate[i:]
                    raise
        engines = (result.status.engines.redrafter, result.status.engines.base)
        self._set_waiting(key, {(claim, e.path) for e in engines if e and e.path and e.state == "Building"})
        validation = result.status.validation
        if (
            validation
            and validation.state == "Passed"
            and (res.status.get("validation") or {}).get("state") != "Passed"
        ):
            # a pair just passed: the policy may now choose the ReDrafter engine; it need not wait its interval
            self._monitors_soon(key)
        record.unplaced = bool(result.unplaced)
        current = {k: v for k, v in res.status.items() if k != "kopf"}
        status = result.status.wire()
        patch = merge_patch(current, status)
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
            record.written = status
        pending, record.events = record.events, []
        for ev in [*result.events, *pending]:
            post_event(body, ev.type, ev.reason, ev.message)
        self.metrics.on_transition(res.namespace, res.name, current, status)
        self.metrics.observe_resource(res.namespace, res.name, res.spec, status)
        if observed.refused:  # the status says it; retried with backoff, since the cause is outside the operator
            raise ChildrenRefused("; ".join(observed.refused))
        self.metrics.reconciles.labels("ok").inc()
        self.metrics.duration.observe(time.perf_counter() - started)
        return result


def _discard(index: dict[Any, set[ResourceKey]], ref: Any, key: ResourceKey) -> None:
    keys = index.get(ref)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[ref]


def _carried(applier: Applier, namespace: str, dep: DeploymentFact) -> str:
    return applier.carried(
        "Deployment",
        namespace,
        dep.name,
        dep.generation,
        ChildState(dep.resource_version, dep.owned_fields, dep.owned_content),
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
