"""Child names are deterministic, DNS-1123 safe and within limits for any resource name."""

from __future__ import annotations

import re

import pytest

from redrafter_operator.render import names

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LONGEST = "a" * 253  # the longest legal custom-resource name


@pytest.mark.parametrize("owner", ["x", "llama3-8b", LONGEST, "a.b.c-" + "z" * 60])
def test_names_are_valid_labels(owner):
    key = "f77810ba3564d1d5671a"
    for name in (
        names.service_name(owner),
        names.service_name(owner, "redrafter"),
        names.service_name(owner, "base"),
        names.serving_deployment_name(owner, "redrafter"),
        names.canary_deployment_name(owner),
        names.serving_config_name(owner, "base"),
        names.build_job_name(owner, "redrafter", key, 3),
        names.build_config_name(owner, "base", key),
    ):
        assert DNS1123_LABEL.fullmatch(name) and len(name) <= 63, name


def test_long_names_stay_distinct_and_stable():
    a = names.build_job_name(LONGEST, "redrafter", "k" * 20)
    b = names.build_job_name(LONGEST, "base", "k" * 20)
    assert a != b and a == names.build_job_name(LONGEST, "redrafter", "k" * 20)
    assert names.build_job_name("x", "redrafter", "k" * 20, 1) != names.build_job_name("x", "redrafter", "k" * 20, 2)


def test_label_values_keep_valid_values():
    assert names.label_value("0.1.0") == "0.1.0"
    long = names.label_value("x" * 100)
    assert len(long) <= 63
