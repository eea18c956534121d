"""treadle enqueue --meta, treadle jobs list --meta KEY=VALUE, treadle jobs show: a job's metadata."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.cli.support import expect, treadle

pytestmark = pytest.mark.subprocess


def metas(conn: psycopg.Connection[Any]) -> list[Any]:
    return [meta for (meta,) in conn.execute("SELECT meta FROM treadle.jobs ORDER BY id")]


def test_enqueue_meta_one_job_and_from_lines(dsn: str, conn: psycopg.Connection[Any], tmp_path: Any) -> None:
    expect(treadle("enqueue", "send", "--meta", '{"tenant": "acme", "region": "eu"}', "--dsn", dsn), 0)
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"to": 1}\n{"to": 2}\n')
    expect(treadle("enqueue", "send", "--from", str(lines), "--meta", '{"tenant": "zeta"}', "--dsn", dsn), 0)
    own = tmp_path / "own.jsonl"
    own.write_text('{"name": "send", "meta": {"tenant": "own"}}\n')
    expect(treadle("enqueue", "--from", str(own), "--meta", '{"tenant": "default"}', "--dsn", dsn), 0)
    assert metas(conn) == [
        {"tenant": "acme", "region": "eu"}, {"tenant": "zeta"}, {"tenant": "zeta"}, {"tenant": "own"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ("[1]", "--meta must be a JSON object, not an array"),
        ('"x"', "--meta must be a JSON object, not a string"),
        ("{", "--meta is not valid JSON"),
    ],
)
def test_enqueue_refuses_bad_meta(dsn: str, conn: psycopg.Connection[Any], meta: str, message: str) -> None:
    done = expect(treadle("enqueue", "send", "--meta", meta, "--dsn", dsn), 2)
    assert message in done.err
    lines_with_bad_meta = expect(
        treadle("enqueue", "--from", "-", "--dsn", dsn, stdin='{"name": "a", "meta": [1]}\n'), 2
    )
    assert "meta" in lines_with_bad_meta.err and "nothing was enqueued" in lines_with_bad_meta.err
    assert metas(conn) == []


def test_list_filters_by_meta_and_show_prints_it(dsn: str, conn: psycopg.Connection[Any]) -> None:
    ids = [
        int(expect(treadle("enqueue", "send", "--meta", meta, "--dsn", dsn), 0).out)
        for meta in ('{"tenant": "acme", "region": "eu"}', '{"tenant": "acme", "region": "us"}', '{"tenant": "zeta"}')
    ]
    plain = int(expect(treadle("enqueue", "send", "--dsn", dsn), 0).out)

    def listed(*filters: str) -> list[int]:
        return [row["id"] for row in expect(treadle("jobs", "list", *filters, "--json", "--dsn", dsn), 0).json()]

    assert listed("--meta", "tenant=acme") == [ids[1], ids[0]]
    assert listed("--meta", "tenant=acme", "--meta", "region=us") == [ids[1]]
    assert listed("--meta", "tenant=nobody") == []
    assert listed() == [plain, *reversed(ids)]
    rows = expect(treadle("jobs", "list", "--meta", "tenant=zeta", "--json", "--dsn", dsn), 0).json()
    assert rows[0]["meta"] == {"tenant": "zeta"}
    bad = expect(treadle("jobs", "list", "--meta", "tenant", "--dsn", dsn), 2)
    assert "--meta takes KEY=VALUE" in bad.err
    shown = expect(treadle("jobs", "show", str(ids[2]), "--dsn", dsn), 0).out
    assert "meta" in shown and '{"tenant": "zeta"}' in shown
    assert expect(treadle("jobs", "show", str(ids[2]), "--json", "--dsn", dsn), 0).json()["meta"] == {"tenant": "zeta"}
