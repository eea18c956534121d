"""A database of each earlier release, with jobs in every state, upgrades to the current
version: its catalog is then the same as a fresh install's, and its jobs, leases and
workflow runs carry on.

The extension's scripts must be installed in the server (`make install` installs the
released scripts, the current one and the upgrades between them). Against pg_tle (make
test-pgtle) both databases are made by a member of pgtle_admin: the old one as each
release's documentation said (its script registered, CREATE SCHEMA, CREATE EXTENSION),
upgraded by `treadle upgrade` (this version registered, then ALTER EXTENSION UPDATE); the
fresh one by `treadle install --mode pgtle`. 0.2.0 was the first release with a pg_tle form.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from uuid import UUID

import psycopg
import pytest

from tests.catalog import describe_difference, snapshot
from tests.conftest import EXTENSION_VERSION, INSTALL, RELEASES, NewDatabase
from tests.pgtle_install import install_pgtle, install_release, prepare_pgtle
from tests.sql.test_sql_enqueue_common import guards
from treadle import install

PGTLE = INSTALL == "pgtle"
# the releases a database upgrades from: with pg_tle, those that had a pg_tle form
UPGRADED_FROM = [r for r in RELEASES if not PGTLE or tuple(map(int, r.split("."))) >= (0, 2, 0)]

SOON = "1 hour"

# Roles set up by the grant helpers, by the name of the helper call: after the upgrade each
# must hold exactly what the same call gives it in a fresh install.
GRANTS = {
    "treadle_up_worker": "grant_worker(%s)",
    "treadle_up_producer": "grant_producer(%s)",
    "treadle_up_dashboard": "grant_dashboard(%s)",
    "treadle_up_viewer": "grant_dashboard(%s, true)",
    "treadle_up_reader": "grant_reader(%s)",  # since 0.2.0
    "treadle_up_admin": "grant_admin(%s)",  # since 0.2.0
}


def grant_roles(conn: psycopg.Connection, roles: Iterable[str] = GRANTS) -> list[str]:
    """Make these GRANTS roles (once per server) and run each one's helper in this database,
    when the installed version has it; returns the roles it granted."""
    granted = []
    for role in roles:
        call = GRANTS[role]
        helper = f"treadle.{call.split('(')[0]}"
        if conn.execute("SELECT to_regproc(%s) IS NULL", (helper,)).fetchone() == (True,):
            continue
        conn.execute(f"DO $$ BEGIN CREATE ROLE {role}; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        conn.execute(f"SELECT treadle.{call % repr(role)}")
        granted.append(role)
    return granted


@dataclass
class Filled:
    """What a 0.1.0 database was filled with, by role."""

    ids: dict[str, int] = field(default_factory=dict)  # label -> job id
    tokens: dict[str, UUID] = field(default_factory=dict)  # label -> lease token of a running job
    run_id: int = 0  # the workflow run, mid-way
    granted: list[str] = field(default_factory=list)  # the GRANTS roles the old version set up
    rows_before: dict[str, list[dict[str, object]]] = field(default_factory=dict)  # just before the upgrade
    rows_after: dict[str, list[dict[str, object]]] = field(default_factory=dict)  # just after it


def table_rows(conn: psycopg.Connection) -> dict[str, list[dict[str, object]]]:
    """Every row of every table of schema treadle, as JSON objects, by table (ordered by the
    first column, the key, which an upgrade keeps first)."""
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_class AS c WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind = 'r'"
        ).fetchall()
    ]
    return {
        t: [r[0] for r in conn.execute(f"SELECT to_jsonb(t) FROM treadle.{t} AS t ORDER BY t").fetchall()]
        for t in tables
    }


def _claim(conn: psycopg.Connection, queue: str, lease: str = SOON) -> tuple[int, UUID]:
    row = conn.execute(
        "SELECT id, lease_token FROM treadle.claim(worker_id => 'old-worker', queues => ARRAY[%s],"
        " lease => %s::interval)",
        (queue, lease),
    ).fetchone()
    assert row is not None, f"nothing to claim in {queue}"
    return row[0], row[1]


def _value(conn: psycopg.Connection, query: str, *params: object) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return int(row[0])


def _enqueue(conn: psycopg.Connection, queue: str, **extra: object) -> int:
    names = "".join(f", {k} => %({k})s" for k in extra)
    row = conn.execute(
        f"SELECT treadle.enqueue(name => 'job', queue => %(queue)s{names})", {"queue": queue, **extra}
    ).fetchone()
    assert row is not None
    return int(row[0])


def fill(conn: psycopg.Connection) -> Filled:
    """Jobs in every state, a periodic series, a workflow run mid-way, keys, a worker and
    roles with grants, each made by the functions of the installed (old) version. One
    queue per label."""
    f = Filled()
    f.ids["available"] = _enqueue(conn, "available", args=psycopg.types.json.Jsonb({"n": 1}))
    f.ids["delayed"] = _enqueue(conn, "delayed", run_at="2999-01-01T00:00:00Z")
    f.ids["keyed"] = _enqueue(conn, "keyed", idempotency_key="key-1")

    _enqueue(conn, "running")
    f.ids["running"], f.tokens["running"] = _claim(conn, "running")

    _enqueue(conn, "retryable")
    job, token = _claim(conn, "retryable")
    assert conn.execute("SELECT treadle.fail(%s, %s, 'boom', retry_in => '1 hour')", (job, token)).fetchone() == (
        "retryable",
    )
    f.ids["retryable"] = job

    _enqueue(conn, "completed")
    job, token = _claim(conn, "completed")
    assert conn.execute("SELECT treadle.complete(%s, %s, '{\"ok\": true}')", (job, token)).fetchone() == ("completed",)
    f.ids["completed"] = job

    _enqueue(conn, "discarded", max_attempts=1)
    job, token = _claim(conn, "discarded")
    assert conn.execute("SELECT treadle.fail(%s, %s, 'fatal')", (job, token)).fetchone() == ("discarded",)
    f.ids["discarded"] = job

    f.ids["cancelled"] = _enqueue(conn, "cancelled")
    assert conn.execute("SELECT treadle.cancel(%s)", (f.ids["cancelled"],)).fetchone() == (True,)

    _enqueue(conn, "cancel-requested")
    f.ids["cancel-requested"], f.tokens["cancel-requested"] = _claim(conn, "cancel-requested")
    assert conn.execute("SELECT treadle.cancel(%s)", (f.ids["cancel-requested"],)).fetchone() == (True,)

    # a periodic series: its first occurrence ran, the next one waits
    _enqueue(conn, "periodic", every="1 hour")
    job, token = _claim(conn, "periodic")
    assert conn.execute("SELECT treadle.complete(%s, %s)", (job, token)).fetchone() == ("completed",)
    f.ids["periodic-next"] = _value(conn, "SELECT next_id FROM treadle.jobs WHERE id = %s", job)

    # a workflow run: step a done, step b running, step c to come
    conn.execute("SELECT treadle.define_workflow('pipeline', ARRAY['a', 'b', 'c'])")
    row = conn.execute(
        "SELECT treadle.start_workflow(name => 'pipeline', input => '{\"x\": 1}',"
        " queue => 'flow', idempotency_key => 'run-1')"
    ).fetchone()
    assert row is not None
    f.run_id = row[0]
    job, token = _claim(conn, "flow")
    assert conn.execute("SELECT treadle.complete(%s, %s, '{\"a\": 1}')", (job, token)).fetchone() == ("completed",)
    f.ids["step-b"], f.tokens["step-b"] = _claim(conn, "flow")
    # a run whose first step waits, unclaimed
    f.ids["waiting-run"] = _value(conn, "SELECT treadle.start_workflow(name => 'pipeline', queue => 'flow-waiting')")

    conn.execute("SELECT treadle.worker_seen('old-worker', 'host', 42, ARRAY['default'], 4, 1)")
    f.granted = grant_roles(conn)
    if conn.execute("SELECT to_regproc('treadle.set_tenant') IS NOT NULL").fetchone() == (True,):
        # 0.2.0's tenants, limits and cron schedules
        conn.execute("SELECT treadle.set_tenant('treadle_up_reader', 'tenant-')")
        conn.execute("SELECT treadle.configure(max_payload_bytes => 65536)")
        conn.execute("SELECT treadle.schedule('nightly', '0 3 * * *', 'report', tz => 'Europe/Paris')")
    if conn.execute("SELECT to_regproc('treadle.set_queue') IS NOT NULL").fetchone() == (True,):
        # 0.3.0's queue limits: a max_depth the upgrade makes a guard of (treadle.enqueue_guards)
        conn.execute("SELECT treadle.set_queue('capped', max_depth => 1)")
        conn.execute("SELECT treadle.set_queue('uncapped', concurrency => 2)")

    states = {row[0] for row in conn.execute("SELECT DISTINCT state FROM treadle.jobs")}
    assert states == {"available", "running", "retryable", "completed", "discarded", "cancelled"}
    return f


@pytest.fixture(scope="module")
def fresh(new_module_database: NewDatabase) -> Iterator[psycopg.Connection]:
    """A database with the current version installed by CREATE EXTENSION, and the GRANTS."""
    url = new_module_database(None)
    if PGTLE:
        install_pgtle(url)
    with psycopg.connect(url, autocommit=True) as conn:
        if not PGTLE:
            conn.execute("CREATE EXTENSION treadle")
        grant_roles(conn)
        yield conn


@pytest.fixture(scope="module", params=UPGRADED_FROM)
def upgraded(
    request: pytest.FixtureRequest, new_module_database: NewDatabase
) -> Iterator[tuple[psycopg.Connection, Filled]]:
    """A database installed at an old version, filled, then `ALTER EXTENSION treadle UPDATE`d."""
    old = request.param
    url = new_module_database(None)
    owner_url = prepare_pgtle(url) if PGTLE else url
    if PGTLE:
        with psycopg.connect(owner_url, autocommit=True) as owner:
            install_release(owner, old)
    with psycopg.connect(url, autocommit=True) as conn:
        if not PGTLE:
            conn.execute(f"CREATE EXTENSION treadle VERSION '{old}'")
        filled = fill(conn)
        filled.rows_before = table_rows(conn)
        if PGTLE:
            with psycopg.connect(owner_url, autocommit=True) as owner:
                install.apply(owner, install.plan_upgrade(owner))
        else:
            conn.execute("ALTER EXTENSION treadle UPDATE")
        filled.rows_after = table_rows(conn)
        grant_roles(conn, [r for r in GRANTS if r not in filled.granted])  # helpers the old version lacked
        yield conn, filled


def test_the_upgraded_catalog_is_a_fresh_install(
    upgraded: tuple[psycopg.Connection, Filled], fresh: psycopg.Connection
) -> None:
    conn, _ = upgraded
    difference = describe_difference(snapshot(conn), snapshot(fresh), "upgraded", "fresh")
    assert difference == "", "the upgraded database differs from a fresh install:\n" + difference


# Columns an upgrade renamed: after-name -> before-name, per table.
RENAMED_COLUMNS = {"tenants": {"tenant_role": "role_name"}}
UNFINISHED = ("available", "retryable", "running")


def test_every_row_keeps_its_values(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    """The upgrade changes no stored value: each row of each old table is there after it,
    with the same values in the old columns (new columns may be added beside them)."""
    _, f = upgraded
    assert f.rows_before["jobs"] and f.rows_before["workflow_runs"] and f.rows_before["workers"]
    # 0.4.0 names a step job workflow:<workflow>/<step>: the unfinished ones take that name
    renamed_steps = [
        row for row in f.rows_before["jobs"] if row["workflow_run_id"] is not None and row["state"] in UNFINISHED
    ]
    assert renamed_steps
    for row in renamed_steps:
        row["name"] = f"{row['name']}/{row['step']}"
    for table, rows in f.rows_before.items():
        # 0.4.0 keeps a tenant by role OID (regrole, read back as the same name)
        renamed = RENAMED_COLUMNS.get(table, {})
        after = [{renamed.get(k, k): v for k, v in row.items()} for row in f.rows_after.get(table, [])]
        kept = [{k: v for k, v in row.items() if k in rows[0]} for row in after] if rows else after
        assert kept == rows, f"treadle.{table} changed in the upgrade"


def test_the_upgraded_version_is_the_current_one(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    conn, _ = upgraded
    assert conn.execute(
        "SELECT treadle.version(), extversion FROM pg_extension WHERE extname = 'treadle'"
    ).fetchone() == (EXTENSION_VERSION, EXTENSION_VERSION)


def test_a_running_job_finishes_with_its_old_lease(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    conn, f = upgraded
    job, token = f.ids["running"], f.tokens["running"]
    assert conn.execute("SELECT treadle.heartbeat(%s, %s, '1 hour')", (job, token)).fetchone() is not None
    assert conn.execute("SELECT treadle.complete(%s, %s, '{\"done\": 1}')", (job, token)).fetchone() == ("completed",)
    assert conn.execute("SELECT state, result FROM treadle.jobs WHERE id = %s", (job,)).fetchone() == (
        "completed",
        {"done": 1},
    )


def test_a_cancel_asked_before_the_upgrade_still_cancels(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    conn, f = upgraded
    job, token = f.ids["cancel-requested"], f.tokens["cancel-requested"]
    assert conn.execute("SELECT treadle.complete(%s, %s)", (job, token)).fetchone() == ("cancelled",)
    assert conn.execute("SELECT state FROM treadle.jobs WHERE id = %s", (job,)).fetchone() == ("cancelled",)


def test_the_workflow_run_goes_on_to_its_next_step(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    conn, f = upgraded
    assert conn.execute(
        "SELECT treadle.complete(%s, %s, '{\"b\": 2}')", (f.ids["step-b"], f.tokens["step-b"])
    ).fetchone() == ("completed",)
    job, token = _claim(conn, "flow")
    assert conn.execute("SELECT step, workflow_run_id FROM treadle.jobs WHERE id = %s", (job,)).fetchone() == (
        "c",
        f.run_id,
    )
    assert conn.execute("SELECT treadle.complete(%s, %s, '{\"c\": 3}')", (job, token)).fetchone() == ("completed",)
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", (f.run_id,)).fetchone() == (
        "completed",
    )
    assert conn.execute("SELECT treadle.workflow_results(%s)", (f.run_id,)).fetchone() == (
        {"a": {"a": 1}, "b": {"b": 2}, "c": {"c": 3}},
    )


def test_step_jobs_in_flight_take_their_step_names_and_go_on(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    """The upgrade names unfinished step jobs workflow:<workflow>/<step> (the running one
    completes with its old lease: test_the_workflow_run_goes_on_to_its_next_step); the
    waiting one is claimed by its step's name, and the next step takes such a name."""
    conn, f = upgraded
    run_id = f.ids["waiting-run"]
    assert conn.execute("SELECT name FROM treadle.jobs WHERE id = %s", (f.ids["step-b"],)).fetchone() == (
        "workflow:pipeline/b",
    )
    assert conn.execute(
        "SELECT count(*) FROM treadle.claim('new-worker', ARRAY['flow-waiting'], names => ARRAY['workflow:pipeline'])"
    ).fetchone() == (0,)
    row = conn.execute(
        "SELECT id, lease_token, step, workflow_run_id FROM treadle.claim('new-worker', ARRAY['flow-waiting'],"
        " names => ARRAY['workflow:pipeline/a'])"
    ).fetchone()
    assert row is not None and row[2:] == ("a", run_id)
    assert conn.execute("SELECT treadle.complete(%s, %s)", row[:2]).fetchone() == ("completed",)
    assert conn.execute(
        "SELECT name, state FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id", (run_id,)
    ).fetchall() == [("workflow:pipeline/a", "completed"), ("workflow:pipeline/b", "available")]


def test_the_0_3_0_definition_stays_a_list_and_a_graph_runs(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    conn, f = upgraded
    assert conn.execute("SELECT steps, after FROM treadle.workflows WHERE name = 'pipeline'").fetchone() == (
        ["a", "b", "c"],
        None,
    )
    assert conn.execute("SELECT after FROM treadle.workflow_runs WHERE id = %s", (f.run_id,)).fetchone() == (None,)
    conn.execute("SELECT treadle.define_workflow('pipeline', ARRAY['a', 'b', 'c'], after => '{\"c\": [\"a\", \"b\"]}')")
    run_id = _value(conn, "SELECT treadle.start_workflow(name => 'pipeline', queue => 'graph')")
    first = conn.execute("SELECT step FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id", (run_id,)).fetchall()
    assert first == [("a",), ("b",)]
    for _ in range(2):
        job, token = _claim(conn, "graph")
        assert conn.execute("SELECT treadle.complete(%s, %s)", (job, token)).fetchone() == ("completed",)
    job, token = _claim(conn, "graph")
    assert conn.execute("SELECT step FROM treadle.jobs WHERE id = %s", (job,)).fetchone() == ("c",)


def test_waiting_jobs_are_claimed_when_due(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    conn, f = upgraded
    assert _claim(conn, "available")[0] == f.ids["available"]
    assert _claim(conn, "keyed")[0] == f.ids["keyed"]
    # treadle's clock, moved by the superuser: the retry and the periodic job fall due, then the delayed one
    with conn.transaction():
        conn.execute("SELECT set_config('treadle.now', (now() + interval '2 hours')::text, true)")
        assert _claim(conn, "retryable")[0] == f.ids["retryable"]
        assert _claim(conn, "periodic")[0] == f.ids["periodic-next"]
    with conn.transaction():
        conn.execute("SET LOCAL treadle.now = '3000-01-01T00:00:00Z'")
        assert _claim(conn, "delayed")[0] == f.ids["delayed"]


def test_idempotency_keys_still_hold(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    conn, f = upgraded
    assert _enqueue(conn, "keyed", idempotency_key="key-1") == f.ids["keyed"]
    assert conn.execute(
        "SELECT treadle.start_workflow(name => 'pipeline', queue => 'flow', idempotency_key => 'run-1')"
    ).fetchone() == (f.run_id,)


def test_finished_jobs_and_the_worker_are_kept(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    conn, f = upgraded
    for state in ("completed", "discarded", "cancelled"):
        assert conn.execute("SELECT state FROM treadle.jobs WHERE id = %s", (f.ids[state],)).fetchone() == (state,)
    assert conn.execute("SELECT last_error FROM treadle.jobs WHERE id = %s", (f.ids["discarded"],)).fetchone() == (
        "fatal",
    )
    assert conn.execute("SELECT host, pid FROM treadle.workers WHERE id = 'old-worker'").fetchone() == ("host", 42)
    conn.execute("SELECT treadle.worker_stopped('old-worker')")
    assert conn.execute("SELECT count(*) FROM treadle.workers").fetchone() == (0,)


def test_jobs_finished_before_the_upgrade_move_to_the_history(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    conn, f = upgraded
    finished = [f.ids[state] for state in ("completed", "discarded", "cancelled")]
    with conn.transaction():  # the clock moved in this transaction only; the moves undone after
        conn.execute("SELECT set_config('treadle.now', (now() + interval '2 minutes')::text, true)")
        assert _value(conn, "SELECT treadle.archive()") >= len(finished)
        moved = conn.execute(
            "SELECT id, state FROM treadle.job_history WHERE id = ANY(%s) ORDER BY id", (finished,)
        ).fetchall()
        assert moved == sorted(zip(finished, ("completed", "discarded", "cancelled"), strict=True))
        assert _value(conn, "SELECT count(*) FROM treadle.job_details WHERE id = ANY(%s)", finished) == 3
        assert conn.execute("SELECT treadle.retry(%s)", (f.ids["discarded"],)).fetchone() == (True,)
        assert (
            _value(conn, "SELECT count(*) FROM treadle.jobs WHERE id = %s AND state = 'available'", f.ids["discarded"])
            == 1
        )
        raise psycopg.Rollback()


def test_the_limits_are_kept_and_the_fan_out_limit_is_configurable(upgraded: tuple[psycopg.Connection, Filled]) -> None:
    """0.4.0's max_map_elements joins the settings row at its default; the owner's payload limit stays."""
    conn, _ = upgraded
    if conn.execute("SELECT count(*) FROM treadle.settings").fetchone() == (0,):  # 0.1.0 had no configure
        conn.execute("SELECT treadle.configure(max_payload_bytes => 65536)")
    assert conn.execute("SELECT max_payload_bytes, max_map_elements FROM treadle.settings").fetchone() == (
        65536,
        100000,
    )
    conn.execute("SELECT treadle.configure(max_map_elements => 3)")
    assert conn.execute("SELECT max_payload_bytes, max_map_elements FROM treadle.settings").fetchone() == (65536, 3)
    conn.execute("SELECT treadle.define_workflow('fan', ARRAY['load', 'each'], maps => '{\"each\": \"load\"}')")
    run_id = _value(conn, "SELECT treadle.start_workflow(name => 'fan', queue => 'fan')")
    job, token = _claim(conn, "fan")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 3 elements"):
        conn.execute("SELECT treadle.complete(%s, %s, '[1, 2, 3, 4]')", (job, token))
    assert conn.execute("SELECT treadle.complete(%s, %s, '[1, 2, 3]')", (job, token)).fetchone() == ("completed",)
    assert conn.execute(
        "SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = %s AND step = 'each'", (run_id,)
    ).fetchone() == (3,)
    conn.execute("SELECT treadle.configure(max_map_elements => 100000)")


def test_the_upgrade_makes_the_enqueue_guards_of_its_tenants_and_max_depths(
    upgraded: tuple[psycopg.Connection, Filled],
) -> None:
    """Each tenant and each queue with a max_depth there was has its guard after the upgrade,
    so enqueue's common call leaves them to the whole way: the max_depth holds."""
    conn, _ = upgraded
    made = guards(conn)
    tenants = conn.execute("SELECT count(*) FROM treadle.tenants").fetchone()
    capped = conn.execute("SELECT count(*) FROM treadle.queues WHERE max_depth IS NOT NULL").fetchone()
    assert tenants is not None and capped is not None
    assert len(made) == tenants[0] + capped[0]
    if capped[0]:
        conn.execute("SELECT treadle.enqueue('n', '{}'::jsonb, queue => 'capped')")
        with pytest.raises(psycopg.Error) as full:
            conn.execute("SELECT treadle.enqueue('n', '{}'::jsonb, queue => 'capped')")
        assert full.value.sqlstate == "TQ001"
