"""A Job's ``spec.podFailurePolicy`` (batch/v1) as the real API server validates it and the real Job
controller applies it, for the emulated cluster.

Without it the emulation would retry a build that exited with a code the policy marks FailJob, or accept
a policy the API server refuses. Sources (Kubernetes 1.30+, the feature is GA in 1.31):
pkg/apis/batch/validation/validation.go (validatePodFailurePolicy) and
pkg/controller/job/pod_failure_policy.go (matchPodFailurePolicy); the condition reason and message as the
task page "Handling retriable and non-retriable pod failures with Pod failure policy" shows them
(``FailureTarget`` then ``Failed``, reason ``PodFailurePolicy``, message ``Container main for pod
default/job-x failed with exit code 42 matching FailJob rule at index 0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .apiserver_schema import Cause

FAIL_JOB, IGNORE, COUNT, FAIL_INDEX = "FailJob", "Ignore", "Count", "FailIndex"
ACTIONS = (FAIL_JOB, IGNORE, COUNT, FAIL_INDEX)
REASON = "PodFailurePolicy"
MAX_RULES = 20
MAX_VALUES = 255


def validate(job: Mapping[str, Any]) -> list[Cause]:
    """The API server's checks of ``spec.podFailurePolicy`` (empty: valid or absent)."""
    spec = job.get("spec") or {}
    policy = spec.get("podFailurePolicy")
    if policy is None:
        return []
    base = "spec.podFailurePolicy"
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    causes: list[Cause] = []
    restart = pod_spec.get("restartPolicy")
    if restart != "Never":
        causes.append(
            Cause(
                "spec.template.spec.restartPolicy",
                "FieldValueInvalid",
                f'Invalid value: "{restart}": only "Never" is supported when podFailurePolicy is specified',
            )
        )
    rules = policy.get("rules")
    if not isinstance(rules, list):
        return causes + [Cause(f"{base}.rules", "FieldValueRequired", "Required value")]
    if len(rules) > MAX_RULES:
        causes.append(
            Cause(f"{base}.rules", "FieldValueTooMany", f"Too many: {len(rules)}: must have at most {MAX_RULES} items")
        )
    containers = {c.get("name") for key in ("containers", "initContainers") for c in pod_spec.get(key) or []}
    for i, rule in enumerate(rules):
        path = f"{base}.rules[{i}]"
        action = rule.get("action")
        if action not in (FAIL_JOB, IGNORE, COUNT) and not (action == FAIL_INDEX and "backoffLimitPerIndex" in spec):
            causes.append(
                Cause(
                    f"{path}.action",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{action}": supported values: "Count", "FailJob", "Ignore"',
                )
            )
        on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if (on_codes is None) == (on_conditions is None):
            causes.append(
                Cause(
                    path,
                    "FieldValueInvalid",
                    "Invalid value: specifying one of OnExitCodes and OnPodConditions is required"
                    if on_codes is None
                    else "Invalid value: specifying both OnExitCodes and OnPodConditions is not supported",
                )
            )
        if on_codes is not None:
            causes += _exit_code_causes(on_codes, f"{path}.onExitCodes", containers)
    return causes


def _exit_code_causes(req: Mapping[str, Any], path: str, containers: set[Any]) -> list[Cause]:
    causes: list[Cause] = []
    name = req.get("containerName")
    if name is not None and name not in containers:
        causes.append(
            Cause(
                f"{path}.containerName",
                "FieldValueInvalid",
                f'Invalid value: "{name}": must be one of the container or initContainer names in the pod template',
            )
        )
    op = req.get("operator")
    if op not in ("In", "NotIn"):
        causes.append(
            Cause(
                f"{path}.operator",
                "FieldValueNotSupported",
                f'Unsupported value: "{op}": supported values: "In", "NotIn"',
            )
        )
    values = req.get("values")
    if not isinstance(values, list) or not values:
        return causes + [
            Cause(f"{path}.values", "FieldValueRequired", "Required value: at least one value is required")
        ]
    if len(values) > MAX_VALUES:
        causes.append(
            Cause(
                f"{path}.values", "FieldValueTooMany", f"Too many: {len(values)}: must have at most {MAX_VALUES} items"
            )
        )
    for j, value in enumerate(values):
        vpath = f"{path}.values[{j}]"
        if op == "In" and value == 0:
            causes.append(Cause(vpath, "FieldValueInvalid", "Invalid value: 0: must not be 0 for the In operator"))
        if j > 0 and value == values[j - 1]:
            causes.append(Cause(vpath, "FieldValueDuplicate", f"Duplicate value: {value}"))
        elif j > 0 and value < values[j - 1]:
            causes.append(Cause(vpath, "FieldValueInvalid", f"Invalid value: {value}: must be ordered"))
    return causes


def match(job: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[str | None, str]:
    """(action of the first matching rule, the Job failure message when it is FailJob); (None, "") when no
    rule matches or there is no policy: the pod then counts against backoffLimit as usual."""
    policy = (job.get("spec") or {}).get("podFailurePolicy")
    if not policy:
        return None, ""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for index, rule in enumerate(policy.get("rules") or []):
        action = rule.get("action")
        if action not in ACTIONS:
            continue  # unknown actions are skipped, as the API documents
        if (req := rule.get("onExitCodes")) is not None:
            hit = _matching_container(statuses, req)
            if hit is None:
                continue
            name, code = hit
            message = (
                f"Container {name} for pod {meta.get('namespace', '')}/{meta.get('name', '')} failed with "
                f"exit code {code} matching {action} rule at index {index}"
            )
            return action, message if action == FAIL_JOB else ""
        patterns = rule.get("onPodConditions") or []
        conditions = status.get("conditions") or []
        if any(
            c.get("type") == p.get("type") and c.get("status") == p.get("status", "True")
            for p in patterns
            for c in conditions
        ):
            message = (
                f"Pod {meta.get('namespace', '')}/{meta.get('name', '')} has condition "
                f"{patterns[0].get('type')} matching {action} rule at index {index}"
            )
            return action, message if action == FAIL_JOB else ""
    return None, ""


def _matching_container(statuses: list[Mapping[str, Any]], req: Mapping[str, Any]) -> tuple[str, int] | None:
    """The first terminated container with a non-zero exit code the requirement matches (0 never matches)."""
    for cs in statuses:
        term = (cs.get("state") or {}).get("terminated")
        if not term or not term.get("exitCode"):
            continue
        if req.get("containerName") not in (None, cs.get("name")):
            continue
        code = int(term["exitCode"])
        if (code in (req.get("values") or [])) == (req.get("operator") == "In"):
            return str(cs.get("name")), code
    return None
