"""CronJob schedules as the API server validates them (robfig/cron v3 ParseStandard + the TZ rule), in the
operator's model and chart defaults, and the start times croniter computes for them."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from redrafter_operator.api.cron import parse_go_duration, parse_standard, schedule_errors
from redrafter_operator.api.defaults import OperatorDefaults
from redrafter_operator.api.spec import CacheRetention, spec_errors

ACCEPTED = [
    "*/5 * * * *",
    "30 3 * * *",
    "0 0 1 1 *",
    "0 9-17/2 * * mon-fri",
    "0 0 * JAN,jul sun",
    "5/15 * * * *",
    "0 3 ? * *",
    "  0   3 * * *",
    "0 0 31 2 *",  # parses, never fires
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
    "@every 1h30m",
    "@every 90s",
    "@every 1.5h",
    "@every 500ms",
]

# (schedule, the API server's message after 'spec.schedule: ') from robfig/cron v3.0.1 parser.go and
# kubernetes validateScheduleFormat
REJECTED = [
    ("99 * * * *", 'Invalid value: "99 * * * *": end of range (99) above maximum (59): 99'),
    ("0 24 * * *", 'Invalid value: "0 24 * * *": end of range (24) above maximum (23): 24'),
    ("0 0 0 * *", 'Invalid value: "0 0 0 * *": beginning of range (0) below minimum (1): 0'),
    ("0 3 * * 7", 'Invalid value: "0 3 * * 7": end of range (7) above maximum (6): 7'),  # croniter: Sunday
    ("0 3 * * * *", 'Invalid value: "0 3 * * * *": expected exactly 5 fields, found 6: [0 3 * * * *]'),
    ("0 3 * * * 2026", 'Invalid value: "0 3 * * * 2026": expected exactly 5 fields, found 6: [0 3 * * * 2026]'),
    ("0 3 * *", 'Invalid value: "0 3 * *": expected exactly 5 fields, found 4: [0 3 * *]'),
    ("0 3 L * *", 'Invalid value: "0 3 L * *": failed to parse int from L: strconv.Atoi: parsing "L": invalid syntax'),
    (
        "0 3 * * 1#2",
        'Invalid value: "0 3 * * 1#2": failed to parse int from 1#2: strconv.Atoi: parsing "1#2": invalid syntax',
    ),
    ("5-1 * * * *", 'Invalid value: "5-1 * * * *": beginning of range (5) beyond end of range (1): 5-1'),
    ("*/0 * * * *", 'Invalid value: "*/0 * * * *": step of range should be a positive number: */0'),
    ("1-2-3 * * * *", 'Invalid value: "1-2-3 * * * *": too many hyphens: 1-2-3'),
    ("1/2/3 * * * *", 'Invalid value: "1/2/3 * * * *": too many slashes: 1/2/3'),
    ("@fortnightly", 'Invalid value: "@fortnightly": unrecognized descriptor: @fortnightly'),
    ("@every", 'Invalid value: "@every": unrecognized descriptor: @every'),
    (
        "@every 1d",
        'Invalid value: "@every 1d": failed to parse duration @every 1d: time: unknown unit "d" in duration "1d"',
    ),
    (
        "@every 10",
        'Invalid value: "@every 10": failed to parse duration @every 10: time: missing unit in duration "10"',
    ),
    (
        "TZ=UTC 0 3 * * *",
        'Invalid value: "TZ=UTC 0 3 * * *": cannot use TZ or CRON_TZ in schedule, use timeZone field instead',
    ),
    (
        "CRON_TZ=Europe/Paris 0 3 * * *",
        'Invalid value: "CRON_TZ=Europe/Paris 0 3 * * *": cannot use TZ or CRON_TZ '
        "in schedule, use timeZone field instead",
    ),
]


@pytest.mark.parametrize("schedule", ACCEPTED)
def test_accepted(schedule: str) -> None:
    assert schedule_errors(schedule) == []
    assert CacheRetention(schedule=schedule).schedule == schedule


@pytest.mark.parametrize(("schedule", "message"), REJECTED)
def test_rejected_with_the_api_servers_words(schedule: str, message: str) -> None:
    assert schedule_errors(schedule) == [message]
    with pytest.raises(ValidationError, match="Invalid value"):
        CacheRetention(schedule=schedule)


def test_a_bad_tz_prefix_is_both_errors() -> None:
    assert schedule_errors("TZ=Nowhere/X 0 3 * * *") == [
        'Invalid value: "TZ=Nowhere/X 0 3 * * *": provided bad location Nowhere/X: unknown time zone Nowhere/X',
        'Invalid value: "TZ=Nowhere/X 0 3 * * *": cannot use TZ or CRON_TZ in schedule, use timeZone field instead',
    ]


def test_an_update_may_keep_a_tz_already_there_but_not_with_time_zone() -> None:
    old = "TZ=UTC 0 3 * * *"
    assert schedule_errors("TZ=UTC 0 4 * * *", old_schedule=old) == []
    assert schedule_errors("TZ=UTC 0 4 * * *", old_schedule=old, time_zone="UTC") == [
        'Invalid value: "TZ=UTC 0 4 * * *": cannot use both timeZone field and TZ or CRON_TZ in schedule'
    ]


def test_the_spec_reports_the_field_and_the_message() -> None:
    from test_cache_render import demo_body  # same dir

    body = demo_body()
    body["spec"]["engine"]["cache"] = {"retention": {"keep": 1, "schedule": "99 * * * *"}}
    assert spec_errors(body["spec"]) == [
        'spec.engine.cache.retention.schedule: Invalid value: "99 * * * *": end of range (99) above maximum (59): 99'
    ]


def test_chart_default_schedule_uses_the_same_check() -> None:
    assert (
        OperatorDefaults.from_env({"REDRAFTER_DEFAULT_CACHE_RETENTION_SCHEDULE": "@every 6h"}).cache_retention_schedule
        == "@every 6h"
    )
    for bad, words in (
        ("99 * * * *", "end of range (99) above maximum (59)"),
        ("@fortnightly", "unrecognized descriptor"),
        ("TZ=UTC 0 3 * * *", "cannot use TZ"),
    ):
        with pytest.raises(ValueError, match="REDRAFTER_DEFAULT_CACHE_RETENTION_SCHEDULE") as info:
            OperatorDefaults.from_env({"REDRAFTER_DEFAULT_CACHE_RETENTION_SCHEDULE": bad})
        assert words in str(info.value)


T0 = dt.datetime(2026, 1, 1, 0, 5, 30, tzinfo=dt.UTC)  # a Thursday


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ("*/5 * * * *", dt.datetime(2026, 1, 1, 0, 10, tzinfo=dt.UTC)),
        ("5/15 * * * *", dt.datetime(2026, 1, 1, 0, 20, tzinfo=dt.UTC)),  # N/step: N-59/step
        ("0 0 1 * mon", dt.datetime(2026, 1, 5, tzinfo=dt.UTC)),  # both days restricted: either matches
        ("0 0 */2 * mon", dt.datetime(2026, 1, 3, tzinfo=dt.UTC)),  # a stepped star is restricted too (robfig)
        ("0 0 * * mon", dt.datetime(2026, 1, 5, tzinfo=dt.UTC)),
        ("0 0 1-31 * *", dt.datetime(2026, 1, 2, tzinfo=dt.UTC)),
        ("@weekly", dt.datetime(2026, 1, 4, tzinfo=dt.UTC)),
        ("@every 90s", dt.datetime(2026, 1, 1, 0, 7, tzinfo=dt.UTC)),  # whole seconds from the given time
        ("@every 200ms", dt.datetime(2026, 1, 1, 0, 5, 31, tzinfo=dt.UTC)),  # at least a second
        ("0 0 31 2 *", None),
    ],
)
def test_next_start_times(schedule: str, expected: dt.datetime | None) -> None:
    assert parse_standard(schedule).next(T0) == expected


def test_next_in_a_time_zone() -> None:
    paris = __import__("zoneinfo").ZoneInfo("Europe/Paris")
    assert parse_standard("0 3 * * *").next(T0, paris) == dt.datetime(2026, 1, 1, 2, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("1h30m", 5400 * 10**9),
        ("1.5h", 5400 * 10**9),
        ("300ms", 3 * 10**8),
        ("-1s", -(10**9)),
        ("0", 0),
        ("1h0.5s", 3600 * 10**9 + 5 * 10**8),
    ],
)
def test_go_durations(text: str, nanos: int) -> None:
    assert parse_go_duration(text) == nanos


@pytest.mark.parametrize(
    ("text", "message"),
    [("", 'time: invalid duration ""'), ("h", 'time: invalid duration "h"'), (".s", 'time: invalid duration ".s"')],
)
def test_go_duration_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_go_duration(text)
    assert str(info.value) == message
