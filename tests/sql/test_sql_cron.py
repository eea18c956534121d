"""treadle.cron_next against Python's croniter, and the DST rules of cron schedules.

croniter is a well-known cron implementation; treadle's parser and next-time search in
SQL must agree with it on many expressions, from many start times, in time zones with
and without summer time, on the days the clocks change. The one place where treadle
differs on purpose (docs/scheduling.md): a wall-clock time that a fall-back change
repeats runs once, at its first pass, for a job at fixed hours; croniter runs it twice.
Jobs whose hour field is * follow real time and run in both passes, as
croniter does.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from itertools import product
from zoneinfo import ZoneInfo

import psycopg
import pytest
from croniter import croniter

from tests.sql.sqlcalls import Connect, WaitBlocked, value

UTC = timezone.utc
STEPS = 6  # occurrences compared after each start time

EXPRESSIONS = [
    "* * * * *",
    "*/5 * * * *",
    "*/7 * * * *",
    "0 * * * *",
    "15,45 * * * *",
    "30 2 * * *",
    "30 1 * * *",
    "0 0 * * *",
    "0 3 * * *",
    "59 23 * * *",
    "*/15 2 * * *",
    "0,30 2,3 * * *",
    "0 */2 * * *",
    "0 9-17 * * 1-5",
    "0 9-17/2 * * mon-fri",
    "5 4 * * sun",
    "0 0 * * 7",
    "0 0 * * fri-sun",
    "0 12 1 * *",
    "0 12 15 * 3",
    "0 0 1,15 * 1",
    "0 0 31 * *",
    "0 0 29 2 *",
    "0 0 1 jan,jul *",
    "0 0 1 */3 *",
    "0 6 1-7 * 1",
    "0 0 1/10 * *",
    "10-20/3 8 * * *",
    "0 0 * feb-apr sat",
    "45 0 * * *",
    "0 1 * * *",
    "23 0-23/2 * * *",
    "0 2 * 3,10,11 0",
    "30 0 28-31 * *",
    "@hourly",
    "@daily",
    "@midnight",
    "@weekly",
    "@monthly",
    "@yearly",
    "@annually",
]

ZONES = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Europe/London",
    "Australia/Sydney",
    "Australia/Lord_Howe",  # 30-minute summer time
    "America/Santiago",  # clocks change at midnight
    "America/Havana",  # clocks change at 00:00 and 01:00
    "Asia/Kolkata",  # +05:30, no summer time
    "Pacific/Chatham",  # +12:45 / +13:45
    "Antarctica/Troll",  # two-hour summer time
]


def real_time(expression: str) -> bool:
    """The hour field is *: the job runs in both passes of a repeated hour."""
    fields = {"@hourly": "0 * * * *"}.get(expression, expression).split()
    return len(fields) == 5 and fields[1] == "*"


def second_pass(moment: datetime) -> bool:
    """moment is the later of two instants that show the same wall-clock time."""
    zone = moment.tzinfo
    assert isinstance(zone, ZoneInfo)
    wall = moment.replace(tzinfo=None)
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    return first < second and moment.astimezone(UTC) == second


def transitions(zone: str, year_from: int = 2024, year_to: int = 2026) -> list[datetime]:
    """The instants, to the hour, just before the zone's UTC offset changes."""
    tz = ZoneInfo(zone)
    found = []
    at = datetime(year_from, 1, 1, tzinfo=UTC)
    end = datetime(year_to, 1, 1, tzinfo=UTC)
    while at < end:
        if at.astimezone(tz).utcoffset() != (at + timedelta(hours=1)).astimezone(tz).utcoffset():
            found.append(at)
        at += timedelta(hours=1)
    return found


def starts(zone: str) -> list[datetime]:
    """Ordinary start times, and times shortly before and on each change of the clocks."""
    tz = ZoneInfo(zone)
    chosen = [
        datetime(2024, 1, 15, 10, 17, 23, tzinfo=tz),
        datetime(2025, 7, 4, 23, 59, 59, tzinfo=tz),
        datetime(2024, 2, 28, 23, 30, tzinfo=tz),
        datetime(2025, 12, 31, 23, 59, tzinfo=tz),
    ]
    for change in transitions(zone):
        for before in (timedelta(hours=26), timedelta(hours=3), timedelta(minutes=61), timedelta(minutes=1)):
            chosen.append((change - before).astimezone(tz))
        chosen.append((change + timedelta(minutes=30)).astimezone(tz))
    return chosen


def croniter_half_hour_quirk(zone: str, expression: str, times: list[datetime]) -> bool:
    """croniter skips the second pass of Lord Howe's half-hour fall-back even for a job whose
    hour field is *; treadle runs it, as for a one-hour change (test_a_half_hour_repeat)."""
    tz = ZoneInfo(zone)
    return zone == "Australia/Lord_Howe" and real_time(expression) and any(second_pass(t.astimezone(tz)) for t in times)


def croniter_expects(expression: str, start: datetime) -> list[datetime]:
    """croniter's next STEPS times, without the second passes treadle leaves out for fixed-time jobs."""
    it = croniter(expression, start)
    out: list[datetime] = []
    while len(out) < STEPS:
        moment = it.get_next(datetime)
        if real_time(expression) or not second_pass(moment):
            out.append(moment.astimezone(UTC))
    return out


def treadle_chains(conn: psycopg.Connection, cases: list[tuple[str, str, datetime]]) -> list[list[datetime]]:
    """For each (expression, zone, start): the next STEPS times, each cron_next of the one before."""
    rows = conn.execute(
        """with recursive input as (
               select * from unnest(%s::text[], %s::text[], %s::timestamptz[])
                        with ordinality as i(cron, tz, start, ord)
           ), chain(ord, n, at) as (
               select i.ord, 0, i.start from input as i
               union all
               select c.ord, c.n + 1, treadle.cron_next(i.cron, i.tz, c.at)
                 from chain as c join input as i on i.ord = c.ord
                where c.n < %s
           )
           select array_agg(at order by n) from chain where n > 0 group by ord order by ord""",
        [[c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases], STEPS],
    ).fetchall()
    return [[moment.astimezone(UTC) for moment in r[0]] for r in rows]


@pytest.mark.parametrize("zone", ZONES)
def test_cron_next_agrees_with_croniter(conn: psycopg.Connection, zone: str) -> None:
    cases = [(e, zone, s) for e, s in product(EXPRESSIONS, starts(zone))]
    got = treadle_chains(conn, cases)
    assert len(got) == len(cases)
    disagreements = [
        (expression, start.isoformat(), [m.isoformat() for m in want], [m.isoformat() for m in have])
        for (expression, _, start), have in zip(cases, got, strict=True)
        if not croniter_half_hour_quirk(zone, expression, have)
        and have != (want := croniter_expects(expression, start))
    ]
    assert not disagreements, f"{len(disagreements)} of {len(cases)} differ; the first: {disagreements[:3]}"


def test_the_comparison_covers_clock_changes() -> None:
    """Each zone with summer time has its changes among the start times (the test above is not vacuous)."""
    for zone in ZONES:
        if zone in ("UTC", "Asia/Kolkata"):
            assert transitions(zone) == []
        else:
            assert len(transitions(zone)) >= 2, zone


def local(conn: psycopg.Connection, cron: str, zone: str, after: str) -> str:
    """The next time as the zone's clocks show it, with its UTC offset."""
    return str(
        value(
            conn,
            "select to_char(treadle.cron_next(%s, %s, %s) at time zone %s, 'YYYY-MM-DD HH24:MI')"
            " || ' ' || to_char(treadle.cron_next(%s, %s, %s), 'TZH:TZM')",
            [cron, zone, after, zone, cron, zone, after],
        )
    )


def test_a_skipped_time_runs_once_when_the_clocks_jump(conn: psycopg.Connection) -> None:
    conn.execute("set timezone = 'America/New_York'")
    # 2024-03-10: 02:00 EST becomes 03:00 EDT; 02:30 never shows on the clocks
    assert local(conn, "30 2 * * *", "America/New_York", "2024-03-09 12:00") == "2024-03-10 03:00 -04:00"
    assert local(conn, "30 2 * * *", "America/New_York", "2024-03-10 03:00") == "2024-03-11 02:30 -04:00"
    # every skipped time of the change runs together, once
    assert local(conn, "*/15 2 * * *", "America/New_York", "2024-03-10 00:00") == "2024-03-10 03:00 -04:00"
    assert local(conn, "*/15 2 * * *", "America/New_York", "2024-03-10 03:00") == "2024-03-11 02:00 -04:00"


def test_a_repeated_time_runs_once_at_its_first_pass(conn: psycopg.Connection) -> None:
    conn.execute("set timezone = 'America/New_York'")
    # 2024-11-03: 02:00 EDT becomes 01:00 EST; 01:30 shows twice
    first = local(conn, "30 1 * * *", "America/New_York", "2024-11-02 12:00")
    assert first == "2024-11-03 01:30 -04:00"
    assert local(conn, "30 1 * * *", "America/New_York", "2024-11-03 01:30-04") == "2024-11-04 01:30 -05:00"
    # from inside the second pass, the next is the next day's
    assert local(conn, "30 1 * * *", "America/New_York", "2024-11-03 01:10-05") == "2024-11-04 01:30 -05:00"


def test_a_job_with_a_rhythm_runs_in_both_passes(conn: psycopg.Connection) -> None:
    conn.execute("set timezone = 'UTC'")
    times = conn.execute(
        """with recursive c(n, at) as (
               select 0, timestamptz '2024-11-03 04:50+00'
               union all select n + 1, treadle.cron_next('*/30 * * * *', 'America/New_York', at) from c where n < 6)
           select to_char(at, 'HH24:MI') from c where n > 0 order by n"""
    ).fetchall()
    # 00:50 EDT, then 01:00 and 01:30 EDT, 01:00 and 01:30 EST, 02:00 EST: every half hour of real time
    assert [t[0] for t in times] == ["05:00", "05:30", "06:00", "06:30", "07:00", "07:30"]


def test_a_half_hour_repeat(conn: psycopg.Connection) -> None:
    """Lord Howe's clocks go back from 02:00 +11 to 01:30 +10:30: the half hour from 01:30 shows twice."""
    times = conn.execute(
        """with recursive c(n, at) as (
               select 0, timestamptz '2024-04-06 14:50+00'
               union all select n + 1, treadle.cron_next('*/10 * * * *', 'Australia/Lord_Howe', at) from c where n < 6)
           select to_char(at, 'HH24:MI') from c where n > 0 order by n"""
    ).fetchall()
    # 01:50 +11 (14:50) was the start; 02:00 is not yet shown, the clocks go back to 01:30 at 15:00
    assert [t[0] for t in times] == ["15:00", "15:10", "15:20", "15:30", "15:40", "15:50"]
    fixed = value(conn, "select treadle.cron_next('40 1 * * *', 'Australia/Lord_Howe', '2024-04-06 14:00+00')")
    assert fixed == datetime(2024, 4, 6, 14, 40, tzinfo=UTC), "a fixed time runs at its first pass"
    after = value(conn, "select treadle.cron_next('40 1 * * *', 'Australia/Lord_Howe', '2024-04-06 14:40+00')")
    assert after == datetime(2024, 4, 7, 15, 10, tzinfo=UTC), "and not at its second"


def test_concurrent_creates_of_one_name_make_one_schedule(connect: Connect) -> None:
    """Twenty sessions create the same schedule at once: one schedule, one occurrence, one id for all."""
    conns = [connect() for _ in range(20)]

    def create(conn: psycopg.Connection) -> int:
        with conn.transaction():
            job_id = value(conn, "select treadle.schedule('race', '*/5 * * * *', 'tick', queue => 'race')")
            conn.execute("select count(*) from treadle.jobs")  # keep the insert uncommitted a little longer
            return int(job_id)

    with ThreadPoolExecutor(len(conns)) as pool:
        ids = list(pool.map(create, conns))
    assert len(set(ids)) == 1
    assert value(conns[0], "select count(*) from treadle.cron_schedules") == 1
    assert value(conns[0], "select count(*) from treadle.jobs where schedule = 'race'") == 1


def test_replacing_a_schedule_while_its_occurrence_finishes(connect: Connect, wait_until_blocked: WaitBlocked) -> None:
    """The finish locks the occurrence then the schedule; schedule() waits in the same order, never deadlocks,
    and then changes the occurrence the finish inserted."""
    setup, finisher, replacer = connect(), connect(autocommit=False), connect(autocommit=False)
    setup.execute("select treadle.schedule('report', '* * * * *', 'report', '{\"v\": 1}', queue => 'rq')")
    setup.execute("update treadle.jobs set run_at = now() - interval '1 minute' where schedule = 'report'")
    job_id, token = setup.execute("select id, lease_token from treadle.claim('w', array['rq'])").fetchone() or (0, 0)
    assert job_id

    assert value(finisher, "select treadle.complete(%s, %s)", [job_id, token]) == "completed"
    pid = value(replacer, "select pg_backend_pid()")
    with ThreadPoolExecutor(1) as pool:
        replaced = pool.submit(
            value, replacer, "select treadle.schedule('report', '* * * * *', 'report', '{\"v\": 2}', queue => 'rq')"
        )
        wait_until_blocked(pid)
        finisher.commit()
        current = replaced.result(timeout=60)
    replacer.commit()

    assert current == value(setup, "select next_id from treadle.jobs where id = %s", [job_id])
    rows = setup.execute(
        "select args, state from treadle.jobs where schedule = 'report' and id <> %s", [job_id]
    ).fetchall()
    assert rows == [({"v": 2}, "available")], "one waiting occurrence, with the new args"
