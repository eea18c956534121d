"""Producers decide how many queues there are, not how large a scrape or the overview gets.

Thousands of queues: /metrics (the dashboard's, and a DatabaseCollector's) names the
top N, the rest summed under one label; the overview shows N queues a page, the busiest
first, with links to the next; the paused queues without jobs are listed N at most.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import psycopg
import pytest
from flask import Flask

from tests.metrics.scraping import named, parse, value
from treadle.dashboard import create_app, dashboard_of
from treadle.metrics import OTHER_QUEUES, DatabaseCollector, database_registry, exposition

QUEUES = 3000  # each with one available job
HOT = {"hot-a": 5, "hot-b": 4, "hot-c": 3}  # available jobs: the busiest queues
PAUSED_EMPTY = 300  # paused queue names with no job (the dashboard's pause makes a row for each)
TOP = 20


@pytest.fixture
def many(conn: psycopg.Connection[Any]) -> int:
    """The test's database with QUEUES + len(HOT) queues holding jobs; returns the jobs' count."""
    conn.execute(
        "SELECT treadle.enqueue('x', queue => 'q' || lpad(g::text, 5, '0')) FROM generate_series(1, %s) AS g",
        [QUEUES],
    )
    for queue, jobs in HOT.items():
        conn.execute("SELECT treadle.enqueue('x', queue => %s) FROM generate_series(1, %s)", [queue, jobs])
    conn.execute("SELECT treadle.pause(queue => 'idle' || g) FROM generate_series(1, %s) AS g", [PAUSED_EMPTY])
    conn.execute("SELECT treadle.pause(queue => 'hot-b')")
    return QUEUES + sum(HOT.values())


@pytest.fixture
def app(operator_dsn: str) -> Iterator[Flask]:
    application = create_app(operator_dsn, secret_key="test-secret", top_queues=TOP)
    yield application
    dashboard_of(application).close()


def test_the_dashboards_metrics_name_the_top_queues_and_sum_the_rest(app: Flask, many: int) -> None:
    response = app.test_client().get("/metrics")
    assert response.status_code == 200
    body = response.get_data(as_text=True)
    assert len(body) < 20_000, len(body)  # 20 queues and the rest: about 6 kB, whatever QUEUES is
    samples = parse(body)
    jobs = named(samples, "treadle_jobs")
    queues = {dict(labels)["queue"] for labels in jobs}
    assert len(queues) == TOP + 1 and OTHER_QUEUES in queues
    assert set(HOT) <= queues  # the busiest are named
    assert sum(jobs.values()) == many  # nothing is lost: the rest is summed
    assert value(samples, "treadle_jobs", queue=OTHER_QUEUES, state="available") == many - sum(HOT.values()) - (
        TOP - len(HOT)
    )
    assert value(samples, "treadle_other_queues") == QUEUES + len(HOT) - TOP
    assert len(named(samples, "treadle_queue_oldest_waiting_seconds")) == TOP + 1
    assert len(named(samples, "treadle_live_workers")) == TOP + 1


def test_a_collector_takes_its_own_bound(dsn: str, many: int) -> None:
    def connect() -> AbstractContextManager[psycopg.Connection[Any]]:
        return psycopg.connect(dsn, autocommit=True)

    few = parse(exposition(database_registry(connect, top_queues=3))[0].decode())
    assert {dict(labels)["queue"] for labels in named(few, "treadle_jobs")} == {*HOT, OTHER_QUEUES}
    everything = parse(exposition(database_registry(connect, top_queues=10_000))[0].decode())
    assert value(everything, "treadle_other_queues") == 0
    assert len({dict(labels)["queue"] for labels in named(everything, "treadle_jobs")}) == QUEUES + len(HOT)
    for bad in (0, 10_001, True, "5"):
        with pytest.raises(ValueError, match="top_queues must be an integer"):
            DatabaseCollector(connect, top_queues=bad)  # type: ignore[arg-type]


def queue_rows(html: str) -> list[str]:
    section = re.search(r'<section id="queues".*?</section>', html, re.S)
    assert section
    return re.findall(r'<tr>\s*<td><a href="/queues/([^"]+)">', section.group(0))


def test_the_overview_shows_a_page_of_queues_the_busiest_first(app: Flask, many: int) -> None:
    client = app.test_client()
    first = client.get("/")
    assert first.status_code == 200
    html = first.get_data(as_text=True)
    assert len(html) < 200_000, len(html)
    rows = queue_rows(html)
    assert rows[:3] == ["hot-a", "hot-b", "hot-c"] and len(rows) == TOP
    assert rows[3:] == [f"q{n:05d}" for n in range(1, TOP - 2)]  # then by name among equals
    assert f"Queues 1\N{EN DASH}{TOP} of {QUEUES + len(HOT):,}, the busiest first." in html
    assert 'href="/?queues=2"' in html and 'rel="prev"' not in html
    assert re.search(r'/queues/hot-b">hot-b</a> <span class="flag paused"', html)
    paused = re.search(r'<p class="note" id="paused-empty">(.*?)</p>', html, re.S)
    assert paused and paused.group(1).count("<a ") == TOP and f"(the first {TOP})" in paused.group(1)

    second = client.get("/?queues=2").get_data(as_text=True)
    assert queue_rows(second) == [f"q{n:05d}" for n in range(TOP - 2, 2 * TOP - 2)]
    assert 'href="/?queues=3"' in second and 'href="/?queues=1"' in second

    last_page = (QUEUES + len(HOT) + TOP - 1) // TOP
    last = client.get(f"/?queues={last_page}").get_data(as_text=True)
    assert queue_rows(last)[-1] == f"q{QUEUES:05d}" and 'rel="next"' not in last
    assert queue_rows(client.get(f"/?queues={last_page + 1}").get_data(as_text=True)) == []

    for bad in ("0", "-1", "x", "1000001"):
        assert client.get(f"/?queues={bad}").status_code == 400, bad
