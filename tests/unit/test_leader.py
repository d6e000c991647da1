"""The pure lease decisions of controller/leader.py (client-go tryAcquireOrRenew/isLeaseValid semantics)."""

from __future__ import annotations

import datetime as dt

import pytest

from redrafter_operator.controller.leader import (
    ElectionConfig,
    LeaseRecord,
    config_errors,
    default_identity,
    desired_record,
    lease_valid,
    micro_time,
    released_record,
)

WALL = dt.datetime(2026, 12, 2, 18, 0, 0, 123456, tzinfo=dt.timezone.utc)
STAMP = "2026-12-02T18:00:00.123456Z"
CFG = ElectionConfig(namespace="ops", name="redrafter-operator", identity="pod-a")


def held_by(holder: str, *, duration: int = 15, transitions: int = 3) -> LeaseRecord:
    return LeaseRecord(holder, duration, "2026-12-02T17:00:00.000000Z", "2026-12-02T17:59:58.000000Z", transitions)


def test_no_lease_is_created_with_us_as_holder() -> None:
    assert desired_record(None, 0.0, 100.0, WALL, CFG) == LeaseRecord("pod-a", 15, STAMP, STAMP, 0)


def test_a_valid_lease_of_another_holder_is_left_alone_until_it_expires_on_our_clock() -> None:
    other = held_by("pod-b")
    # observed at t=100 with a 15 s lease: valid through t<115, whatever renewTime says
    assert desired_record(other, 100.0, 114.9, WALL, CFG) is None
    taken = desired_record(other, 100.0, 115.0, WALL, CFG)
    assert taken == LeaseRecord("pod-a", 15, STAMP, STAMP, 4)  # a takeover: new acquireTime, transitions + 1


def test_the_holders_lease_duration_counts_not_ours() -> None:
    other = held_by("pod-b", duration=60)
    assert desired_record(other, 0.0, 59.0, WALL, CFG) is None
    assert desired_record(other, 0.0, 61.0, WALL, CFG) is not None


def test_renewal_keeps_acquire_time_and_transitions() -> None:
    mine = held_by("pod-a")
    renewed = desired_record(mine, 0.0, 1000.0, WALL, CFG)  # our own lease: renewable even when "expired"
    assert renewed == LeaseRecord("pod-a", 15, mine.acquire_time, STAMP, 3)


def test_a_released_lease_is_taken_at_once() -> None:
    released = released_record(held_by("pod-b"), WALL)
    assert released == LeaseRecord("", 1, STAMP, STAMP, 3)
    assert desired_record(released, 100.0, 100.0, WALL, CFG) == LeaseRecord("pod-a", 15, STAMP, STAMP, 4)


def test_lease_validity_is_strict_at_the_boundary() -> None:
    rec = held_by("x", duration=15)
    assert lease_valid(rec, 10.0, 24.999)
    assert not lease_valid(rec, 10.0, 25.0)


def test_record_round_trips_through_a_lease_spec() -> None:
    rec = LeaseRecord("pod-a", 15, STAMP, STAMP, 2)
    assert rec.to_spec() == {
        "holderIdentity": "pod-a",
        "leaseDurationSeconds": 15,
        "acquireTime": STAMP,
        "renewTime": STAMP,
        "leaseTransitions": 2,
    }
    assert LeaseRecord.from_lease({"spec": rec.to_spec()}) == rec
    assert LeaseRecord.from_lease({"spec": {}}) == LeaseRecord()
    assert LeaseRecord.from_lease({}) == LeaseRecord()


def test_micro_time_has_six_digits_in_utc() -> None:
    assert micro_time(WALL) == STAMP
    plus2 = dt.datetime(2026, 12, 2, 20, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert micro_time(plus2) == "2026-12-02T18:00:00.000000Z"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease_duration": 10, "renew_deadline": 10}, "must be greater than renew deadline"),
        ({"renew_deadline": 2.4, "retry_period": 2}, "must be greater than retry period × 1.2"),
        ({"retry_period": 0}, "greater than zero"),
        ({"lease_duration": 15.5}, "whole seconds"),
        ({"identity": ""}, "identity must not be empty"),
        ({"name": ""}, "must not be empty"),
    ],
)
def test_config_is_checked_like_client_go(kwargs: dict, message: str) -> None:
    base = {"namespace": "ops", "name": "l", "identity": "pod-a"}
    with pytest.raises(ValueError, match=message):
        ElectionConfig(**{**base, **kwargs})


def test_defaults_are_client_go_core_defaults() -> None:
    assert (CFG.lease_duration, CFG.renew_deadline, CFG.retry_period) == (15.0, 10.0, 2.0)
    assert config_errors(CFG) == []


def test_identity_is_the_pod_name_else_unique_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "rdo-redrafter-operator-5d9c7-a1")
    assert default_identity() == "rdo-redrafter-operator-5d9c7-a1"
    monkeypatch.delenv("POD_NAME")
    a, b = default_identity(), default_identity()
    assert a != b and a.split("_")[0] == b.split("_")[0]


# ---- the `run` flags (controller/main.py)
def test_run_flags_default_to_client_go_and_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from redrafter_operator.cli import build_parser

    args = build_parser().parse_args(["run"])
    assert not args.leader_elect and not args.standalone
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (15.0, 10.0, 2.0)
    assert args.leader_election_id == "redrafter-operator" and args.leader_election_namespace is None
    for name, value in {
        "REDRAFTER_LEADER_ELECT": "1",
        "REDRAFTER_LEADER_ELECTION_NAMESPACE": "ops",
        "REDRAFTER_LEADER_ELECTION_ID": "lease-x",
        "REDRAFTER_LEASE_DURATION": "30s",
        "REDRAFTER_RENEW_DEADLINE": "20",
        "REDRAFTER_RETRY_PERIOD": "500ms",
    }.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["run"])
    assert args.leader_elect and args.leader_election_namespace == "ops" and args.leader_election_id == "lease-x"
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (30.0, 20.0, 0.5)
    assert build_parser().parse_args(["run", "--lease-duration", "1m"]).lease_duration == 60.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--peering", "x"], "--peering (kopf peering) was replaced by --leader-elect"),
        (
            ["--leader-elect", "--leader-election-namespace", "ops", "--lease-duration", "5", "--renew-deadline", "6"],
            "lease duration (5s) must be greater than renew deadline (6s)",
        ),
        (["--leader-elect", "--leader-election-namespace", "ops", "--lease-duration", "15.5s"], "whole seconds"),
    ],
)
def test_run_rejects_bad_election_flags_with_a_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from redrafter_operator.cli import main

    assert main(["run", *argv]) == 2
    assert message in capsys.readouterr().err


def test_run_needs_a_lease_namespace_off_cluster(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from redrafter_operator.cli import main
    from redrafter_operator.controller import main as run_module

    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(run_module, "SERVICE_ACCOUNT_NAMESPACE", "/nonexistent/namespace")
    assert main(["run", "--leader-elect"]) == 2
    assert "--leader-elect needs --leader-election-namespace" in capsys.readouterr().err


def test_a_bad_duration_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    from redrafter_operator.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "--retry-period", "soon"])
    assert exit_.value.code == 2
    assert "'soon' is not a duration such as 15s, 500ms or 1m" in capsys.readouterr().err
