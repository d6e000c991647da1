"""batch/v1 CronJob admission, as the real API server does it: defaults, then validation (422 Invalid).

Sources: kubernetes pkg/apis/batch/validation/validation.go (ValidateCronJobCreate/Update,
validateCronJobSpec, validateScheduleFormat, validateTimeZone, validateConcurrencyPolicy,
ValidateJobTemplateSpec and the validateJobSpec checks a template goes through),
pkg/apis/batch/v1/defaults.go (SetDefaults_CronJob). The schedule is parsed by the operator's
robfig/cron-compatible parser (redrafter_operator.api.cron), so the emulator and the operator refuse the
same schedules with the same words.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping
from typing import Any

from redrafter_operator.api.cron import go_quote, schedule_errors

from . import podfailurepolicy
from .apiserver_schema import Cause

CONCURRENCY_POLICIES = ("Allow", "Forbid", "Replace")
#: the controller names each Job ``<cronjob>-<minutes since the epoch>`` (11 more characters, 63 at most)
NAME_MAX = 52
_TZ_PART = re.compile(r"^[A-Za-z.\-_0-9+]{1,14}$")
NONNEGATIVE_JOB_FIELDS = (
    "parallelism",
    "completions",
    "activeDeadlineSeconds",
    "backoffLimit",
    "ttlSecondsAfterFinished",
    "backoffLimitPerIndex",
    "maxFailedIndexes",
)


def apply_defaults(cronjob: dict[str, Any]) -> None:
    """SetDefaults_CronJob: what a stored CronJob always has."""
    spec = cronjob.setdefault("spec", {})
    spec.setdefault("concurrencyPolicy", "Allow")
    spec.setdefault("suspend", False)
    spec.setdefault("successfulJobsHistoryLimit", 3)
    spec.setdefault("failedJobsHistoryLimit", 1)


def validate(cronjob: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[Cause]:
    """The API server's checks of a CronJob being created (``old`` None) or updated (empty: valid)."""
    causes: list[Cause] = []
    name = (cronjob.get("metadata") or {}).get("name", "")
    spec = cronjob.get("spec") or {}
    old_spec = (old or {}).get("spec") or {} if old is not None else None
    schedule = spec.get("schedule") or ""
    if not schedule:
        causes.append(Cause("spec.schedule", "FieldValueRequired", "Required value"))
    else:
        for message in schedule_errors(
            schedule,
            old_schedule=(old_spec or {}).get("schedule") if old is not None else None,
            time_zone=spec.get("timeZone"),
        ):
            causes.append(Cause("spec.schedule", "FieldValueInvalid", message))
    causes += _nonnegative(spec, ("startingDeadlineSeconds",), "spec")
    if old_spec is None or old_spec.get("timeZone") != spec.get("timeZone"):
        causes += _time_zone(spec.get("timeZone"))
    policy = spec.get("concurrencyPolicy")
    if not policy:
        causes.append(Cause("spec.concurrencyPolicy", "FieldValueRequired", "Required value"))
    elif policy not in CONCURRENCY_POLICIES:
        causes.append(
            Cause(
                "spec.concurrencyPolicy",
                "FieldValueNotSupported",
                f"Unsupported value: {go_quote(str(policy))}: supported values: "
                + ", ".join(f'"{p}"' for p in CONCURRENCY_POLICIES),
            )
        )
    causes += job_template_causes(spec.get("jobTemplate") or {}, "spec.jobTemplate")
    causes += _nonnegative(spec, ("successfulJobsHistoryLimit", "failedJobsHistoryLimit"), "spec")
    if old is None and len(name) > NAME_MAX:
        causes.append(
            Cause(
                "metadata.name",
                "FieldValueInvalid",
                f"Invalid value: {go_quote(name)}: must be no more than {NAME_MAX} characters",
            )
        )
    return causes


def job_template_causes(template: Mapping[str, Any], path: str) -> list[Cause]:
    """ValidateJobTemplateSpec: the Job spec checks, a selector the server generates, the restart policy."""
    spec = template.get("spec") or {}
    base = f"{path}.spec"
    causes = _nonnegative(spec, NONNEGATIVE_JOB_FIELDS, base)
    # the pod failure policy as for a Job, its field paths under the template
    causes += [
        Cause(f"{path}.{c.field}" if c.field else path, c.reason, c.message)
        for c in podfailurepolicy.validate({"spec": spec})
        if c.field != "spec.template.spec.restartPolicy"
    ]
    restart = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy") or ""
    rp_path = f"{base}.template.spec.restartPolicy"
    if restart in ("", "Always"):
        causes.append(Cause(rp_path, "FieldValueRequired", 'Required value: valid values: "OnFailure", "Never"'))
    elif restart not in ("OnFailure", "Never"):
        causes.append(
            Cause(
                rp_path,
                "FieldValueNotSupported",
                f'Unsupported value: {go_quote(restart)}: supported values: "OnFailure", "Never"',
            )
        )
    elif spec.get("podFailurePolicy") is not None and restart != "Never":
        causes.append(
            Cause(
                rp_path,
                "FieldValueInvalid",
                f'Invalid value: {go_quote(restart)}: only "Never" is supported when podFailurePolicy is specified',
            )
        )
    if spec.get("selector") is not None:
        causes.append(
            Cause(f"{base}.selector", "FieldValueInvalid", 'Invalid value: "object": `selector` will be auto-generated')
        )
    if spec.get("manualSelector") is True:
        causes.append(
            Cause(
                f"{base}.manualSelector",
                "FieldValueNotSupported",
                'Unsupported value: true: supported values: "nil", "false"',
            )
        )
    return causes


def _nonnegative(spec: Mapping[str, Any], fields: tuple[str, ...], path: str) -> list[Cause]:
    """ValidateNonnegativeField for each field present."""
    return [
        Cause(f"{path}.{f}", "FieldValueInvalid", f"Invalid value: {spec[f]}: must be greater than or equal to 0")
        for f in fields
        if isinstance(spec.get(f), int) and spec[f] < 0
    ]


def _time_zone(tz: Any) -> list[Cause]:
    """validateTimeZone: an IANA name this machine's tz database knows (Go's time.LoadLocation)."""
    if tz is None:
        return []
    path = "spec.timeZone"
    if tz == "":
        return [Cause(path, "FieldValueInvalid", 'Invalid value: "": timeZone must be nil or non-empty string')]
    for part in str(tz).split("/"):
        if part in (".", "..") or part.startswith("-") or not _TZ_PART.match(part):
            return [Cause(path, "FieldValueInvalid", f"Invalid value: {go_quote(tz)}: unknown time zone {tz}")]
    causes = []
    if str(tz).lower() == "local":
        causes.append(
            Cause(
                path,
                "FieldValueInvalid",
                f"Invalid value: {go_quote(tz)}: timeZone must be an explicit "
                "time zone as defined in https://www.iana.org/time-zones",
            )
        )
    if tz not in ("UTC", "Local"):
        try:
            zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {go_quote(tz)}: unknown time zone {tz}"))
    return causes
