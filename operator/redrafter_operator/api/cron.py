"""CronJob schedules as Kubernetes reads them: the one robfig-compatible parser of this code base.

The API server validates ``CronJob.spec.schedule`` with robfig/cron v3 ``ParseStandard`` and the
controller computes start times with the same parser, so a schedule is valid exactly when that parser
takes it. This module accepts what ParseStandard accepts and rejects the rest with its own error text:

* five fields (minute, hour, day of month, month, day of week), each a comma list of ``*``/``?``, a
  number, a name (``jan``..``dec``, ``sun``..``sat``) or a range ``a-b``, with an optional ``/step``;
  day of week is 0-6 (no 7), no ``L``/``W``/``#``, no seconds or years field;
* the descriptors ``@yearly @annually @monthly @weekly @daily @midnight @hourly`` and
  ``@every <Go duration>``;
* a ``TZ=``/``CRON_TZ=`` prefix parses, but the API server refuses any ``TZ`` in a new schedule
  (Kubernetes 1.27+: "cannot use TZ or CRON_TZ in schedule, use timeZone field instead").

croniter computes the start times: it is given the parsed fields as explicit lists (``*`` only where
robfig keeps its star bit), so its own, wider grammar (seconds, years, ``L``, ``7`` for Sunday) is never
reached, and its day-of-month/day-of-week OR rule is robfig's.

Sources: robfig/cron v3.0.1 parser.go, spec.go, constantdelay.go; kubernetes
pkg/apis/batch/validation/validation.go (validateScheduleFormat, validateCronJobSpec); Go's
time.ParseDuration and strconv.Atoi error texts.
"""

from __future__ import annotations

import datetime
import re
import zoneinfo
from dataclasses import dataclass

from croniter import CroniterBadDateError, croniter

TZ_IN_SCHEDULE = "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
TZ_AND_TIME_ZONE = "cannot use both timeZone field and TZ or CRON_TZ in schedule"
DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")

_MONTHS = {
    m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))
}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (min, max, names) of minute, hour, day of month, month, day of week
_BOUNDS = ((0, 59, None), (0, 23, None), (1, 31, None), (1, 12, _MONTHS), (0, 6, _DAYS))
_DESCRIPTOR_FIELDS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = 2**63 - 1


class CronError(ValueError):
    """A schedule robfig/cron ParseStandard refuses; the message is the parser's."""


@dataclass(frozen=True)
class Field:
    values: frozenset[int]
    star: bool  # robfig's star bit: ``*`` or ``?`` with a step of 1 (decides the day-of-month/week rule)


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule: five fields, or a constant delay (``@every``); ``location`` from a TZ= prefix."""

    fields: tuple[Field, ...] | None
    every_seconds: int | None = None
    location: str | None = None

    def next(self, after: datetime.datetime, tz: datetime.tzinfo | None = None) -> datetime.datetime | None:
        """The first start time strictly after ``after`` (aware), in ``tz`` (default: the TZ= prefix, else
        UTC); None when the fields never meet (``59 23 31 2 *``), where robfig returns the zero time."""
        if self.every_seconds is not None:  # robfig ConstantDelaySchedule: whole seconds from ``after``
            return after.replace(microsecond=0) + datetime.timedelta(seconds=self.every_seconds)
        assert self.fields is not None
        if any(not f.values for f in self.fields):  # a field of commas only: robfig accepts it, nothing matches
            return None
        zone = tz or (zoneinfo.ZoneInfo(self.location) if self.location else datetime.UTC)
        try:
            when: datetime.datetime = croniter(self.croniter_expression(), after.astimezone(zone)).get_next(
                datetime.datetime
            )
        except CroniterBadDateError:
            return None
        return when.astimezone(after.tzinfo)

    def croniter_expression(self) -> str:
        """The fields as croniter reads them the way robfig means them: explicit lists, ``*`` for a star."""
        assert self.fields is not None
        return " ".join("*" if f.star else ",".join(str(v) for v in sorted(f.values)) for f in self.fields)


def parse_standard(spec: str) -> Schedule:
    """robfig/cron v3 ``ParseStandard``: a Schedule, or CronError with the parser's message."""
    if not spec:
        raise CronError("empty spec string")
    location = None
    if spec.startswith("TZ=") or spec.startswith("CRON_TZ="):
        space, eq = spec.find(" "), spec.index("=")
        name = spec[eq + 1 : space] if space >= 0 else spec[eq + 1 :]
        if not _known_location(name):
            raise CronError(f"provided bad location {name}: unknown time zone {name}")
        location = name if name not in ("", "Local") else None  # Local: the controller's zone, UTC here
        spec = spec[space:].strip() if space >= 0 else ""
    if spec.startswith("@"):
        return _descriptor(spec, location)
    fields = spec.split()
    if len(fields) != 5:
        raise CronError(f"expected exactly 5 fields, found {len(fields)}: [{' '.join(fields)}]")
    return Schedule(tuple(_field(text, *bounds) for text, bounds in zip(fields, _BOUNDS)), location=location)


def schedule_errors(schedule: str, *, old_schedule: str | None = None, time_zone: str | None = None) -> list[str]:
    """What the API server says of ``spec.schedule`` (validateScheduleFormat); empty when it takes it.

    ``old_schedule``: the stored schedule on an update (a TZ already there may stay, without timeZone)."""
    if not schedule:
        return ["Required value"]
    errors = []
    try:
        parse_standard(schedule)
    except CronError as exc:
        errors.append(f"Invalid value: {go_quote(schedule)}: {exc}")
    allow_tz = old_schedule is not None and "TZ" in old_schedule
    if allow_tz and "TZ" in schedule and time_zone is not None:
        errors.append(f"Invalid value: {go_quote(schedule)}: {TZ_AND_TIME_ZONE}")
    elif not allow_tz and "TZ" in schedule:
        errors.append(f"Invalid value: {go_quote(schedule)}: {TZ_IN_SCHEDULE}")
    return errors


def check_schedule(schedule: str) -> str:
    """``schedule`` when a new CronJob may carry it, else ValueError with the API server's words
    (``Invalid value: "99 * * * *": end of range (99) above maximum (59): 99``)."""
    errors = schedule_errors(schedule)
    if errors:
        raise ValueError("; ".join(errors))
    return schedule


def go_quote(text: str) -> str:
    """Go's %q / strconv.Quote for the texts schedules hold."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# ----------------------------------------------------------------------------- the parser's pieces


def _known_location(name: str) -> bool:
    """Go's time.LoadLocation: "" and UTC are UTC, Local the machine's zone, else the tz database."""
    if name in ("", "UTC", "Local"):
        return True
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _descriptor(spec: str, location: str | None) -> Schedule:
    if spec in _DESCRIPTOR_FIELDS:
        return Schedule(
            tuple(_field(t, *b) for t, b in zip(_DESCRIPTOR_FIELDS[spec].split(), _BOUNDS)), location=location
        )
    every = "@every "
    if spec.startswith(every):
        try:
            nanos = parse_go_duration(spec[len(every) :])
        except ValueError as exc:
            raise CronError(f"failed to parse duration {spec}: {exc}") from None
        nanos = max(nanos, 10**9)  # robfig Every: under a second is a second, then whole seconds
        return Schedule(None, every_seconds=nanos // 10**9, location=location)
    raise CronError(f"unrecognized descriptor: {spec}")


def _field(text: str, low: int, high: int, names: dict[str, int] | None) -> Field:
    values: set[int] = set()
    star = False
    for expr in (r for r in text.split(",") if r):  # strings.FieldsFunc: empty items are dropped
        bits, expr_star = _range(expr, low, high, names)
        values |= bits
        star = star or expr_star
    return Field(frozenset(values), star)


def _range(expr: str, low: int, high: int, names: dict[str, int] | None) -> tuple[set[int], bool]:
    range_and_step = expr.split("/")
    low_and_high = range_and_step[0].split("-")
    single = len(low_and_high) == 1
    star = False
    if low_and_high[0] in ("*", "?"):
        start, end, star = low, high, True
    else:
        start = _int_or_name(low_and_high[0], names)
        if len(low_and_high) == 1:
            end = start
        elif len(low_and_high) == 2:
            end = _int_or_name(low_and_high[1], names)
        else:
            raise CronError(f"too many hyphens: {expr}")
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _uint(range_and_step[1])
        if single:  # "N/step" means "N-max/step"
            end = high
        if step > 1:
            star = False
    else:
        raise CronError(f"too many slashes: {expr}")
    if start < low:
        raise CronError(f"beginning of range ({start}) below minimum ({low}): {expr}")
    if end > high:
        raise CronError(f"end of range ({end}) above maximum ({high}): {expr}")
    if start > end:
        raise CronError(f"beginning of range ({start}) beyond end of range ({end}): {expr}")
    if step == 0:
        raise CronError(f"step of range should be a positive number: {expr}")
    return set(range(start, end + 1, step)), star


def _int_or_name(expr: str, names: dict[str, int] | None) -> int:
    if names and expr.lower() in names:
        return names[expr.lower()]
    return _uint(expr)


def _uint(expr: str) -> int:
    """robfig mustParseInt: strconv.Atoi, then no negatives."""
    if not _INT.fullmatch(expr):
        raise CronError(f"failed to parse int from {expr}: strconv.Atoi: parsing {go_quote(expr)}: invalid syntax")
    num = int(expr)
    if not -_INT64_MAX - 1 <= num <= _INT64_MAX:
        raise CronError(f"failed to parse int from {expr}: strconv.Atoi: parsing {go_quote(expr)}: value out of range")
    if num < 0:
        raise CronError(f"negative number ({num}) not allowed: {expr}")
    return num


_UNITS = {
    "ns": 1,
    "us": 10**3,
    "\u00b5s": 10**3,
    "\u03bcs": 10**3,
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}


def parse_go_duration(text: str) -> int:
    """Go's time.ParseDuration, in nanoseconds; ValueError with Go's message."""
    orig, s, neg, total = text, text, False, 0
    invalid = ValueError(f"time: invalid duration {go_quote(orig)}")
    if s and s[0] in "+-":
        neg, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise invalid
    while s:
        if not (s[0] == "." or s[0].isascii() and s[0].isdigit()):
            raise invalid
        m = re.match(r"[0-9]*", s)
        assert m is not None  # ``*``: matches, possibly empty, at any position
        whole, s = m.group(), s[m.end() :]
        frac = ""
        if s.startswith("."):
            f = re.match(r"[0-9]*", s[1:])
            assert f is not None
            frac, s = f.group(), s[1 + f.end() :]
        if not whole and not frac:
            raise invalid
        u = re.match(r"[^0-9.]*", s)
        assert u is not None
        unit, s = u.group(), s[u.end() :]
        if not unit:
            raise ValueError(f"time: missing unit in duration {go_quote(orig)}")
        if unit not in _UNITS:
            raise ValueError(f"time: unknown unit {go_quote(unit)} in duration {go_quote(orig)}")
        scale = _UNITS[unit]
        value = int(whole or "0") * scale
        if frac:
            value += int(int(frac) * scale / 10 ** len(frac))
        total += value
        if total > 2**63 - (0 if neg else 1):
            raise invalid
    return -total if neg else total
