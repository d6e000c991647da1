"""Engine builds (pure): each variant's engine status, and the build ConfigMap + Job when one is needed.

How the operator knows an engine artifact is complete (documented choice):
  1. a *succeeded* build Job labelled with the engine key whose artifact (cache claim + path) matches —
     from this resource or any other in the namespace (Jobs are kept a day after they finish);
  2. else any ReDrafterDeployment in the namespace whose status shows that key Ready/Cached with the
     same claim + path (status outlives the Jobs), including this resource's own previous status.
  The build Job itself publishes atomically (manifest written last), so "Job succeeded" implies
  "artifact complete". A Job running for the same artifact anywhere in the namespace is waited on,
  never duplicated: two resources sharing a cache with identical build inputs produce one build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from engine_jobs.contract import BuildResult, Variant
from engine_jobs.errors import ExitCode

from ..api.engine_key import engine_key
from ..api.status import EngineStatus
from ..api.types import parse_duration
from ..render import cache_jobs, names
from ..render.build import artifact_path, build_configmap, build_job
from ..render.common import Owner
from ..render.placement import place
from .build_failure import not_retried_message
from .facts import ANNOTATION_CACHE_CLAIM, ANNOTATION_RETRY_TOKEN, JobFact, Observed
from .plan_types import READY_STATES, EventSpec, Plan, Resource

MESSAGE_LIMIT = 1024  # engine failure messages in status (the full stderr tail stays in the Pod)


def _failure_text(job: JobFact, observed: Observed) -> str:
    pod = observed.pods.get(job.name)
    detail = (pod.message if pod and pod.message else job.message).strip()
    return _bounded(f"Job {job.name} failed ({job.reason or 'Failed'})" + (f": {detail}" if detail else ""))


def _bounded(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _built(out: EngineStatus, message: str, old: Mapping[str, Any]) -> None:
    """sizeBytes and builtAt from a build Pod's success message, else what status already knew."""
    result = BuildResult.from_message(message)
    if result is not None:
        out.size_bytes, out.built_at = result.size_bytes, result.built_at
    else:
        out.size_bytes, out.built_at = old.get("sizeBytes"), old.get("builtAt")


@dataclass(frozen=True)
class Stage:
    """One content-addressed artifact of the pipeline and the Jobs that produce it: an engine (variant
    ``redrafter``/``base``) or the trained drafter (``drafter``). Same cache, same Job bookkeeping."""

    name: str  # the Jobs' variant label
    what: str  # in messages and Events: "redrafter engine", "drafter"
    key: str
    path: str
    retries: int
    children: Callable[[int], list[dict[str, Any]]]  # attempt -> [ConfigMap, Job]
    old: Mapping[str, Any]  # its status before this plan
    collects: bool = True  # after running out of disk, collect unreferenced engines before one more try
    gpu_resource: str = "nvidia.com/gpu"  # the extended resource its Job's GPUs are counted in
    reasons: Mapping[str, str] = field(default_factory=dict)  # Event reasons over the builds' defaults


BUILD_REASONS = {
    "started": "BuildStarted",
    "waiting": "BuildWaiting",
    "ready": "EngineReady",
    "cached": "EngineCached",
    "failed": "BuildFailed",
    "not_retried": "BuildNotRetried",
}
TRAINING_REASONS = {
    "started": "TrainingStarted",
    "waiting": "TrainingWaiting",
    "ready": "DrafterTrained",
    "cached": "DrafterCached",
    "failed": "TrainingFailed",
    "not_retried": "TrainingNotRetried",
}


def engine_stage(res: Resource, owner: Owner, variant: Variant, key: str | None = None) -> Stage:
    spec = owner.spec
    key = key or engine_key(spec, variant)
    return Stage(
        name=variant,
        what=f"{variant} engine",
        key=key,
        path=artifact_path(spec, key),
        retries=spec.engine.build.retries,
        children=lambda attempt: [build_configmap(owner, variant), build_job(owner, variant, attempt)],
        old=(res.status.get("engines") or {}).get(variant) or {},
        gpu_resource=spec.engine.build.gpu_resource,
    )


WAITING_FOR_NODE = "waiting for a node that can run its Job: "


def _new_job(
    stage: Stage, attempt: int, token: str, claim: str, plan: Plan, observed: Observed
) -> dict[str, Any] | None:
    """The stage's Job (and its ConfigMap) added to the plan and claimed; returned for last touches.

    None when no node could ever run it (product, GPU count, selector, taints): nothing is created, so no
    Pod sits Unschedulable and no retry is spent; the node watch wakes the resource when one appears.
    """
    children = stage.children(attempt)
    job = children[-1]
    if observed.nodes is not None:
        where = place(job["spec"]["template"]["spec"], observed.nodes, stage.gpu_resource)
        if not where.fits:
            plan.unplaced.append((stage.what, where.message))
            return None
        plan.placed.append((stage.what, where.message))
    ann = job["metadata"].setdefault("annotations", {})
    ann[ANNOTATION_RETRY_TOKEN] = token
    ann[ANNOTATION_CACHE_CLAIM] = claim
    plan.create += children
    plan.claims.append((claim, stage.path, job["metadata"]["name"]))
    return job


def _collect_and_retry(owner: Owner, failed: list[JobFact], epoch: list[JobFact], observed: Observed) -> str | None:
    """Why the next build should collect first (the last one ran out of disk), or None.

    Once per retry epoch, and only with a retention: which unreferenced engines may go is the user's call.
    The collecting build is one extra attempt, beyond spec.engine.build.retries.
    """
    if not failed or any(j.collected for j in epoch) or not owner.spec.engine.cache.retention.enabled:
        return None
    pod = observed.pods.get(failed[-1].name)
    text = (pod.message if pod else "") or failed[-1].message
    if not text.startswith(f"{ExitCode.OUT_OF_DISK.name}:"):
        return None
    return f"Job {failed[-1].name} ran out of disk ({' '.join(text.split())[:300]})"


def plan_engine(
    res: Resource, owner: Owner, variant: Variant, observed: Observed, plan: Plan, key: str | None = None
) -> EngineStatus:
    """One variant's engine status; appends the build ConfigMap + Job to ``plan.create`` when needed.
    ``key``: the variant's engine key when the caller already computed it."""
    return plan_stage(res, owner, engine_stage(res, owner, variant, key), observed, plan)


def plan_stage(res: Resource, owner: Owner, stage: Stage, observed: Observed, plan: Plan) -> EngineStatus:
    """One artifact's status (engine or drafter); appends its ConfigMap + Job to ``plan.create`` when needed."""
    spec = owner.spec
    variant, key, path, retries = stage.name, stage.key, stage.path, stage.retries
    claim = spec.engine.cache.claim_name
    token = res.retry_token
    old = stage.old if stage.old.get("key") == key and stage.old.get("path") == path else {}
    jobs = sorted(
        (
            j
            for j in observed.jobs
            if j.variant == variant and j.key == key and j.claim == claim and j.artifact in ("", path)
        ),
        key=lambda j: j.attempt,
    )
    epoch = [j for j in jobs if j.retry_token == token]
    failed = [j for j in epoch if j.state == "Failed"]
    running = [j for j in jobs if j.state == "Running"]
    succeeded = [j for j in jobs if j.state == "Succeeded"]
    shared = observed.shared.get(variant)
    out = EngineStatus(key=key, path=path, attempts=len(epoch), retry_token=token)
    if succeeded:
        pod = observed.pods.get(succeeded[-1].name)
        out.state, out.job = "Ready", succeeded[-1].name
        _built(out, pod.message if pod else "", old)
    elif old.get("state") in READY_STATES:
        out.state, out.job, out.attempts = old["state"], old.get("job"), old.get("attempts", 0)
        _built(out, "", old)
    elif shared and shared.ready_by:
        out.state = "Cached"
        out.message = f"{stage.what} already in the cache (built for {shared.ready_by})"
        _built(out, shared.built_message, old)
    elif running:
        out.state, out.job = "Building", running[-1].name
        if failed:
            out.message = _failure_text(failed[-1], observed)
        if running[-1].collected:
            out.message = _bounded(
                f"{out.message or 'out of disk'}; Job {running[-1].name} collects "
                f"unreferenced engines in cache claim {claim}, then builds once more"
            )
    elif shared and shared.building_job:
        out.state, out.job = "Building", shared.building_job
        out.message = f"waiting for Job {shared.building_job}, which makes the same {stage.what} in the shared cache"
    else:
        n_failed = len(failed)
        final_code = next((j.final_exit_code for j in reversed(failed) if j.final_exit_code is not None), None)
        if not jobs and old.get("state") == "Failed" and old.get("retryToken", "") == token:
            n_failed = int(old.get("attempts") or 0)  # the failed Jobs expired; status remembers
            final_code = old.get("exitCode")
        disk = _collect_and_retry(owner, failed, epoch, observed) if stage.collects else None
        attempt = max((j.attempt for j in jobs), default=-1) + 1
        wants_job = disk is not None or not (final_code is not None or n_failed > retries)
        job = _new_job(stage, attempt, token, claim, plan, observed) if wants_job else None
        if wants_job and job is None:
            out.state, out.attempts = "Pending", n_failed
            out.message = _bounded(WAITING_FOR_NODE + plan.unplaced[-1][1])
        elif disk is not None and job is not None:
            r = spec.engine.cache.retention
            max_age = f"{int(parse_duration(r.max_age))}s" if r.max_age else None
            cache_jobs.collect_before_build(job, claim=claim, keep=r.keep, max_age=max_age)
            out.state, out.job, out.attempts = "Building", job["metadata"]["name"], n_failed + 1
            out.message = _bounded(
                f"{disk}; collecting unreferenced engines in cache claim {claim} (retention keep={r.keep}, "
                f"maxAge={r.max_age}), then one more build"
            )
        elif final_code is not None and failed:  # podFailurePolicy ended it: no attempt can fix this code
            msg = f"{not_retried_message(owner.name, final_code)}. {_failure_text(failed[-1], observed)}"
            out.state, out.job, out.attempts, out.exit_code = "Failed", failed[-1].name, n_failed, final_code
            out.message = _bounded(msg)
        elif final_code is not None or n_failed > retries:
            out.state, out.job = "Failed", failed[-1].name if failed else old.get("job")
            out.message = (
                _failure_text(failed[-1], observed) if failed else old.get("message") or f"{stage.what} failed"
            )
            out.attempts, out.exit_code = n_failed, final_code
        elif job is not None:
            out.state, out.job, out.attempts = "Building", job["metadata"]["name"], n_failed + 1
            if failed:
                out.message = _failure_text(failed[-1], observed)
    _engine_events(stage, old, out, observed, plan, owner.name)
    return out


def _engine_events(
    stage: Stage, old: Mapping[str, Any], new: EngineStatus, observed: Observed, plan: Plan, resource: str
) -> None:
    what, retries, reason = stage.what, stage.retries, {**BUILD_REASONS, **stage.reasons}
    state, job = new.state, new.job
    if old.get("state") == state and old.get("job") == job:
        return
    prev_job = next((j for j in observed.jobs if j.name == old.get("job")), None)
    if prev_job and prev_job.state == "Failed" and (state == "Failed" or job != prev_job.name):
        plan.events.append(EventSpec("Warning", reason["failed"], f"{what}: {_failure_text(prev_job, observed)}"))
    if state == "Building" and job != old.get("job"):
        if job and any(c[2] == job for c in plan.claims):
            plan.events.append(
                EventSpec(
                    "Normal",
                    reason["started"],
                    f"Job {job} makes the {what} {new.key} (attempt {new.attempts} of {retries + 1})",
                )
            )
        else:
            plan.events.append(
                EventSpec(
                    "Normal",
                    reason["waiting"],
                    f"{what} {new.key}: {new.message or f'Job {job} is making it'}",
                )
            )
    elif state == "Ready":
        plan.events.append(EventSpec("Normal", reason["ready"], f"{what} {new.key} is ready ({new.path})"))
    elif state == "Cached":
        plan.events.append(
            EventSpec("Normal", reason["cached"], f"{what} {new.key} found in the cache ({new.path}); nothing to run")
        )
    elif state == "Failed":
        if not prev_job or prev_job.state != "Failed":
            plan.events.append(EventSpec("Warning", reason["failed"], f"{what}: {new.message or ''}"))
        if new.exit_code is not None:
            plan.events.append(
                EventSpec(
                    "Warning",
                    reason["not_retried"],
                    f"{what} {new.key}: {not_retried_message(resource, new.exit_code)}",
                )
            )
            return
        plan.events.append(
            EventSpec(
                "Warning",
                "RetriesExhausted",
                f"{what} {new.key}: {new.attempts} Jobs failed; "
                f"change the spec or set annotation {names.ANNOTATION_RETRY_BUILD} to retry",
            )
        )
