"""The emulated API server and Job controller treat podFailurePolicy as Kubernetes does (validation,
first matching rule wins, FailJob message and reason, exit code 0 never matches)."""

from __future__ import annotations

import copy

import pytest

from redrafter_sim import podfailurepolicy as pfp

JOB = {
    "spec": {
        "backoffLimit": 3,
        "podFailurePolicy": {
            "rules": [
                {"action": "Ignore", "onExitCodes": {"containerName": "build", "operator": "In", "values": [137]}},
                {"action": "FailJob", "onExitCodes": {"containerName": "build", "operator": "In", "values": [2, 6]}},
            ]
        },
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "build"}]}},
    }
}


def pod(code: int, container: str = "build") -> dict:
    return {
        "metadata": {"name": "job-x-abcde", "namespace": "ml"},
        "status": {"containerStatuses": [{"name": container, "state": {"terminated": {"exitCode": code}}}]},
    }


def test_fail_job_rule_matches_with_the_controllers_message():
    assert pfp.match(JOB, pod(2)) == (
        "FailJob",
        "Container build for pod ml/job-x-abcde failed with exit code 2 matching FailJob rule at index 1",
    )
    assert pfp.match(JOB, pod(6))[0] == "FailJob"
    assert pfp.match(JOB, pod(137)) == ("Ignore", "")


@pytest.mark.parametrize("p", [pod(3), pod(0), pod(2, container="sidecar")])
def test_other_codes_count_against_backoff_limit(p):
    assert pfp.match(JOB, p) == (None, "")
    assert pfp.match({"spec": {}}, pod(2)) == (None, "")


def test_unknown_action_is_skipped_and_not_in_operator_works():
    job = copy.deepcopy(JOB)
    job["spec"]["podFailurePolicy"]["rules"] = [
        {"action": "Retry", "onExitCodes": {"operator": "In", "values": [2]}},
        {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [3]}},
    ]
    assert pfp.match(job, pod(2))[1].endswith("matching FailJob rule at index 1")
    assert pfp.match(job, pod(3)) == (None, "")


def test_valid_policy_passes_validation():
    assert pfp.validate(JOB) == []
    assert pfp.validate({"spec": {"template": {"spec": {"restartPolicy": "OnFailure"}}}}) == []  # no policy


@pytest.mark.parametrize(
    ("mutate", "field", "text"),
    [
        (
            lambda s: s["template"]["spec"].update(restartPolicy="OnFailure"),
            "spec.template.spec.restartPolicy",
            'only "Never" is supported when podFailurePolicy is specified',
        ),
        (
            lambda s: s["podFailurePolicy"]["rules"][1]["onExitCodes"].update(containerName="main"),
            "spec.podFailurePolicy.rules[1].onExitCodes.containerName",
            "must be one of the container",
        ),
        (
            lambda s: s["podFailurePolicy"]["rules"][1]["onExitCodes"].update(values=[6, 2]),
            "spec.podFailurePolicy.rules[1].onExitCodes.values[1]",
            "must be ordered",
        ),
        (
            lambda s: s["podFailurePolicy"]["rules"][1]["onExitCodes"].update(values=[0, 2]),
            "spec.podFailurePolicy.rules[1].onExitCodes.values[0]",
            "must not be 0 for the In operator",
        ),
        (
            lambda s: s["podFailurePolicy"]["rules"][1]["onExitCodes"].update(values=[2, 2]),
            "spec.podFailurePolicy.rules[1].onExitCodes.values[1]",
            "Duplicate value",
        ),
        (
            lambda s: s["podFailurePolicy"]["rules"][1].update(action="Retry"),
            "spec.podFailurePolicy.rules[1].action",
            "Unsupported value",
        ),
        (
            lambda s: s["podFailurePolicy"]["rules"][1].update(onPodConditions=[{"type": "DisruptionTarget"}]),
            "spec.podFailurePolicy.rules[1]",
            "specifying both",
        ),
    ],
)
def test_invalid_policy_is_refused_naming_the_field(mutate, field, text):
    job = copy.deepcopy(JOB)
    mutate(job["spec"])
    causes = pfp.validate(job)
    assert any(c.field == field and text in c.message for c in causes), causes
