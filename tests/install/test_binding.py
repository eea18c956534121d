"""Every form of the install binds only to pg_catalog and treadle, whatever the installer's
search_path holds.

A role that may create in schema public (common on managed servers, the very target of the
plain install) plants look-alikes there first: a copy of every built-in function that
treadle's sources call by name (public.jsonb_path_exists among them), of every built-in
operator of the types treadle uses, and a domain public.jsonb. Each planted function notes
its call in a setting of the session and hands over to the built-in, so an install that
binds to them still works. The installer's search_path puts public first. Then no object of
treadle (function, view rule, default, check, policy, trigger, index, type) depends on a
function, operator, type, collation or relation outside pg_catalog and treadle, and a job's
whole life (enqueue, claim, complete, the views) calls nothing planted.

The released 0.3.0 plain script bound to them: the last test shows that this check sees it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.conftest import ROOT, NewDatabase, as_role
from tests.plain_install import PLAIN_OWNER
from treadle import install
from treadle.install import run_script

# where a planted function notes its calls: a setting of the session that called it
NOTE = "treadle_test.planted"
# the installer's path, where public would win over pg_catalog
ATTACKER_PATH = "-c search_path=public,pg_catalog"

RECORDER = f"""
CREATE FUNCTION public.planted_call(what text) RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('{NOTE}', concat_ws('; ', nullif(current_setting('{NOTE}', true), ''), what), false);
END
$$
"""

FUNCTIONS = """
SELECT p.oid::regprocedure::text, p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
       p.pronargs, p.provariadic <> 0, p.provolatile, p.proisstrict, p.proretset, p.prorettype = 'void'::regtype
  FROM pg_proc AS p
 WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f' AND p.proname = ANY(%s)
"""

OPERATORS = """
SELECT o.oid, o.oid::regoperator::text, o.oprname,
       CASE WHEN o.oprleft <> 0 THEN format_type(o.oprleft, NULL) END, format_type(o.oprright, NULL),
       format_type(o.oprresult, NULL), c.proname, c.provolatile, c.proisstrict
  FROM pg_operator AS o JOIN pg_proc AS c ON c.oid = o.oprcode
 WHERE o.oprnamespace = 'pg_catalog'::regnamespace AND o.oprname = ANY(%s)
   AND (o.oprleft = 0 OR o.oprleft = ANY(%s::regtype[])) AND o.oprright = ANY(%s::regtype[])
"""
# the types of treadle's columns and arguments
TYPES = ["text", "jsonb", "int8", "int4", "int2", "bool", "timestamptz", "interval", "name", "uuid", "numeric"]
TYPES += ["float8", "_text", "_int8", "xid8", "oid"]

# what a planted function's own body binds to
PINNED = "SET search_path = pg_catalog, pg_temp"
VOLATILITY = {"i": "IMMUTABLE", "s": "STABLE", "v": "VOLATILE"}

# every dependency of an object of treadle on an object of another schema but pg_catalog
FOREIGN_DEPENDENCIES = """
WITH treadle_objects(classid, objid) AS (
    SELECT 'pg_proc'::regclass, oid FROM pg_proc WHERE pronamespace = 'treadle'::regnamespace
    UNION ALL SELECT 'pg_class'::regclass, oid FROM pg_class WHERE relnamespace = 'treadle'::regnamespace
    UNION ALL SELECT 'pg_type'::regclass, oid FROM pg_type WHERE typnamespace = 'treadle'::regnamespace
    UNION ALL SELECT 'pg_operator'::regclass, oid FROM pg_operator WHERE oprnamespace = 'treadle'::regnamespace
    UNION ALL SELECT 'pg_constraint'::regclass, oid FROM pg_constraint WHERE connamespace = 'treadle'::regnamespace
    UNION ALL SELECT 'pg_rewrite'::regclass, r.oid FROM pg_rewrite AS r JOIN pg_class AS c ON c.oid = r.ev_class
               WHERE c.relnamespace = 'treadle'::regnamespace
    UNION ALL SELECT 'pg_attrdef'::regclass, a.oid FROM pg_attrdef AS a JOIN pg_class AS c ON c.oid = a.adrelid
               WHERE c.relnamespace = 'treadle'::regnamespace
    UNION ALL SELECT 'pg_policy'::regclass, p.oid FROM pg_policy AS p JOIN pg_class AS c ON c.oid = p.polrelid
               WHERE c.relnamespace = 'treadle'::regnamespace
    UNION ALL SELECT 'pg_trigger'::regclass, t.oid FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
               WHERE c.relnamespace = 'treadle'::regnamespace
)
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) || ' -> '
       || pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid)
  FROM pg_depend AS d JOIN treadle_objects AS o ON o.classid = d.classid AND o.objid = d.objid
 WHERE (pg_identify_object(d.refclassid, d.refobjid, 0)).schema NOT IN ('pg_catalog', 'treadle')
 ORDER BY 1
"""
# the shorter query docs/operations.md gives the reader, word for word
DOCS_QUERY = r"""SELECT pg_describe_object(d.classid, d.objid, d.objsubid) AS treadle_object,
       pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid) AS depends_on
  FROM pg_depend AS d
 WHERE (pg_identify_object(d.refclassid, d.refobjid, 0)).schema NOT IN ('pg_catalog', 'treadle')
   AND pg_describe_object(d.classid, d.objid, d.objsubid) ~ '\mtreadle\.';"""
# how many dependencies among treadle's own objects the same query sees (it must see some)
OWN_DEPENDENCIES = FOREIGN_DEPENDENCIES.replace("NOT IN ('pg_catalog', 'treadle')", "= 'treadle'").replace(
    "ORDER BY 1", ""
)


def called_names() -> list[str]:
    """Every name the sources call as name(...): the built-ins among them are the candidates."""
    text = "".join(p.read_text() for p in sorted((ROOT / "sql").glob("src/*.sql")))
    text += "".join(p.read_text() for p in sorted((ROOT / "sql" / "upgrade").glob("*.sql")))
    return sorted({name.lower() for name in re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", text)})


def operator_names() -> list[str]:
    text = "".join(p.read_text() for p in sorted((ROOT / "sql").glob("src/*.sql")))
    text = re.sub(r"'(?:[^']|'')*'", "''", re.sub(r"--[^\n]*", "", text))
    return sorted(set(re.findall(r"[-+*/<>=~!@#%^&|?]+", text)))


def plant(url: str) -> dict[str, int]:
    """As the role that may create in public: the look-alikes. Returns how many of each it made."""
    made = {"functions": 0, "operators": 0}
    with psycopg.connect(url, autocommit=True, options="-c search_path=pg_catalog") as conn:
        conn.execute(RECORDER)
        for signature, name, arguments, result, nargs, variadic, volatile, strict, retset, void in conn.execute(
            FUNCTIONS, (called_names(),)
        ).fetchall():
            args = [f"${i}" for i in range(1, nargs + 1)]
            if variadic:
                args[-1] = f"VARIADIC {args[-1]}"
            call = f"pg_catalog.{sql.Identifier(name).as_string(conn)}({', '.join(args)})"
            if void:
                returning = f"PERFORM {call}; RETURN;"
            elif retset:
                returning = f"RETURN QUERY SELECT * FROM {call}; RETURN;"
            else:
                returning = f"RETURN {call};"
            if _made(
                conn,
                f"CREATE FUNCTION public.{sql.Identifier(name).as_string(conn)}({arguments}) RETURNS {result}"
                f" LANGUAGE plpgsql {VOLATILITY[volatile]}{' STRICT' if strict else ''} {PINNED} AS $planted$"
                f" BEGIN PERFORM public.planted_call({sql.Literal(signature).as_string(conn)}); {returning}"
                " END $planted$",
            ):
                made["functions"] += 1
        names = operator_names()
        for oid, signature, name, left, right, result, code, volatile, strict in conn.execute(
            OPERATORS, (names, TYPES, TYPES)
        ).fetchall():
            params = ", ".join(t for t in (left, right) if t is not None)
            operands = "$1, $2" if left is not None else "$1"
            if _made(
                conn,
                f"CREATE FUNCTION public.planted_op_{oid}({params}) RETURNS {result} LANGUAGE plpgsql"
                f" {VOLATILITY[volatile]}{' STRICT' if strict else ''} {PINNED} AS $planted$"
                f" BEGIN PERFORM public.planted_call({sql.Literal(signature).as_string(conn)});"
                f" RETURN pg_catalog.{code}({operands}); END $planted$;"
                f" CREATE OPERATOR public.{name} ({'LEFTARG = ' + left + ', ' if left else ''}RIGHTARG = {right},"
                f" FUNCTION = public.planted_op_{oid})",
            ):
                made["operators"] += 1
        conn.execute("CREATE DOMAIN public.jsonb AS pg_catalog.jsonb")
    return made


def _made(conn: psycopg.Connection[Any], statement: str) -> bool:
    """Run one planting statement; False when the server refuses it (a pseudo-type argument)."""
    try:
        with conn.transaction():
            conn.execute(statement.encode())
    except psycopg.Error:
        return False
    return True


@pytest.fixture
def database(pg_server: str, new_database: NewDatabase, make_role: Callable[[str], str]) -> tuple[str, str]:
    """An empty database, its installer (PLAIN_OWNER, CREATE on it and nothing more), and the
    URL of a role that may create in public: (database URL, planter URL)."""
    url = new_database(None)
    planter = make_role("planter")
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"""DO $$ BEGIN
                             CREATE ROLE {PLAIN_OWNER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
                         EXCEPTION WHEN duplicate_object THEN NULL;
                         END $$""")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'GRANT CREATE ON DATABASE "{url.rsplit("/", 1)[1]}" TO {PLAIN_OWNER}')
        conn.execute(f'GRANT CREATE ON SCHEMA public TO "{planter}"')
    return url, as_role(url, planter)


def installer(url: str) -> psycopg.Connection[Any]:
    """The installer's session, its search_path public first."""
    conn = psycopg.connect(as_role(url, PLAIN_OWNER), autocommit=True, options=ATTACKER_PATH)
    assert conn.execute("SHOW search_path").fetchone() == ("public,pg_catalog",)
    return conn


def planted_sanely(planter: str) -> None:
    made = plant(planter)
    # a copy of each built-in the sources call, and of each operator of their types
    assert made["functions"] > 100 and made["operators"] > 150, made


def foreign_dependencies(url: str) -> list[str]:
    """Read as the superuser, in a session that binds to pg_catalog only."""
    with psycopg.connect(url, options="-c search_path=pg_catalog") as conn:
        return _foreign_dependencies(conn)


def _foreign_dependencies(conn: psycopg.Connection[Any]) -> list[str]:
    assert (conn.execute(f"SELECT count(*) FROM ({OWN_DEPENDENCIES}) AS own").fetchone() or (0,))[0] > 100
    return [row[0] for row in conn.execute(FOREIGN_DEPENDENCIES).fetchall()]


def planted_calls_of_a_job(conn: psycopg.Connection[Any]) -> str:
    """A job's whole life in the installer's session (the owner's, whose calls a planted
    function would run as), and the views; then what planted code that session ran."""
    job = conn.execute("SELECT treadle.enqueue('bound', '{\"a\": [1, {\"b\": 2}]}', queue => 'q')").fetchone()
    assert job is not None
    claimed = conn.execute("SELECT id, lease_token FROM treadle.claim('w', queues => ARRAY['q'])").fetchone()
    assert claimed is not None and claimed[0] == job[0]
    assert conn.execute("SELECT treadle.complete(%s, %s, '{\"ok\": true}')", claimed).fetchone() == ("completed",)
    for view in ("queue_stats", "throughput", "recent_failures", "job_details", "live_workers", "queue_settings"):
        conn.execute(f"SELECT * FROM treadle.{view}").fetchall()
    conn.execute("SELECT * FROM treadle.job_counts()").fetchall()
    return str((conn.execute(f"SELECT pg_catalog.current_setting('{NOTE}', true)").fetchone() or ("",))[0] or "")


def test_the_plain_install_binds_nothing_planted(database: tuple[str, str]) -> None:
    url, planter = database
    planted_sanely(planter)
    with installer(url) as conn:
        install.apply(conn, install.plan_install(conn, mode="plain"))
        assert install.installed(conn) == install.Installed("plain", install.VERSION)
        assert foreign_dependencies(url) == []
        assert planted_calls_of_a_job(conn) == ""


@pytest.mark.parametrize("old", ["0.3.0", "0.2.0"])
def test_the_plain_upgrade_binds_nothing_planted(database: tuple[str, str], old: str) -> None:
    """A release installed as released, before anything was planted; `treadle upgrade` after
    (from 0.2.0, through the released 0.2.0 -> 0.3.0 script, which set no search_path)."""
    url, planter = database
    with psycopg.connect(as_role(url, PLAIN_OWNER), autocommit=True) as conn:
        run_script(conn, (ROOT / "sql" / "plain" / f"treadle-{old}.sql").read_text())
        conn.execute(f"SELECT treadle.enqueue('from-{old}')")
    planted_sanely(planter)
    with installer(url) as conn:
        plan = install.plan_upgrade(conn)
        assert plan.summary.startswith(f"upgrade plain treadle from {old} to {install.VERSION}")
        # what --dry-run prints binds so too, run by psql
        assert plan.sql.splitlines()[1] == "SET search_path = pg_catalog, pg_temp;"
        install.apply(conn, plan)
        assert conn.execute("SHOW search_path").fetchone() == ("public,pg_catalog",)  # the session's, put back
        assert install.installed(conn) == install.Installed("plain", install.VERSION)
        assert foreign_dependencies(url) == []
        assert planted_calls_of_a_job(conn) == ""


@pytest.mark.extension_only
def test_the_extension_binds_nothing_planted(database: tuple[str, str]) -> None:
    url, planter = database
    planted_sanely(planter)
    with installer(url) as conn:
        conn.execute("CREATE EXTENSION treadle")
        assert foreign_dependencies(url) == []
        assert planted_calls_of_a_job(conn) == ""


def test_the_check_sees_what_the_released_0_3_0_plain_script_bound(database: tuple[str, str]) -> None:
    """0.3.0's plain script set no search_path: its SQL-standard bodies bound to the planted
    public.jsonb_path_exists, and every enqueue ran it as treadle's owner."""
    url, planter = database
    planted_sanely(planter)
    with installer(url) as conn:
        run_script(conn, (ROOT / "sql" / "plain" / "treadle-0.3.0.sql").read_text())
        bound = foreign_dependencies(url)
        too_deep = [line for line in bound if line.startswith("function treadle._too_deep(")]
        assert any("jsonb_path_exists" in line for line in too_deep), bound
        assert "jsonb_path_exists" in planted_calls_of_a_job(conn)
    # the query the docs give lists the same
    assert DOCS_QUERY in (ROOT / "docs" / "operations.md").read_text()
    with psycopg.connect(url, options="-c search_path=pg_catalog") as conn:
        listed = conn.execute(DOCS_QUERY.encode()).fetchall()
    assert sorted(f"{row[0]} -> {row[1]}" for row in listed) == sorted(bound)
