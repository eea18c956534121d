"""Test databases used again: when a test ends, its database is put back as the template left
it, instead of dropped, if nothing but rows and sequences changed in it.

A new database is a `CREATE DATABASE` from the template, which writes all of the template (11
MB, an empty database's catalog most of it) through the WAL, and a `DROP DATABASE` after. Four
processes doing that at once took a median of 137 to 168 ms a database, and 1.0 s once
checkpoints came; putting one back, 50 to 83 ms (Dec 6, two cores). In one hour, `make test`
took 555 s with every database created and dropped (TREADLE_TEST_DATABASES=fresh) and 407
with this pool (PostgreSQL 15's pytest 401 s against 327, the plain install's 135 against 60).

A database is used again only when all of these hold; otherwise it is dropped, as always:

- No session is left in it. Every one is ended, then the database is renamed, so that a
  process of the ended test that connects again by the old name finds no database, as after
  a drop; the next test has a name never used before.
- Its catalog is the template's: each of the database's own catalogs has as many rows as in the
  template's copy and none written since the database was last put back (`xmin`: a DDL, a
  GRANT, a COMMENT, an ALTER, a TRUNCATE by the test writes one); no setting, comment,
  subscription, replication slot or prepared transaction names it; its `pg_database` row
  (owner, rights, limits) is the template's.
- The tables the template has rows in hold those rows, once the others are emptied.

Then it is put back: the tables the test wrote (their size with their indexes is not a fresh
copy's: a table emptied by DELETE and VACUUM keeps its indexes' pages) are truncated, the sequences set back, the
planner's statistics on its tables removed (ANALYZE's, autovacuum's: a fresh copy has none),
the sizes the planner reads written as a fresh copy has them (a TRUNCATE leaves an index a page
of no rows) and the database's statistics counters reset, the reset's own reads included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

# the schemas of user objects: not the system's, nor sessions' temporary ones
_USER_SCHEMA = "n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND n.nspname !~ '^pg_(toast_)?temp_'"
_DATABASE_ROW = """
    SELECT d.oid, d.datdba, d.encoding, d.datcollate, d.datctype, d.datistemplate, d.datallowconn,
           d.datconnlimit, d.datacl::text
      FROM pg_catalog.pg_database AS d WHERE d.datname = pg_catalog.current_database()"""
# rows about this database in the server's shared catalogs, and what holds it
_SHARED = """
    SELECT (SELECT count(*) FROM pg_catalog.pg_db_role_setting WHERE setdatabase = %(db)s),
           (SELECT count(*) FROM pg_catalog.pg_shdescription WHERE objoid = %(db)s),
           (SELECT count(*) FROM pg_catalog.pg_shseclabel WHERE objoid = %(db)s),
           (SELECT count(*) FROM pg_catalog.pg_subscription WHERE subdbid = %(db)s),
           (SELECT count(*) FROM pg_catalog.pg_replication_slots WHERE datoid = %(db)s),
           (SELECT count(*) FROM pg_catalog.pg_prepared_xacts WHERE database = pg_catalog.current_database())"""
_CATALOGS = """
    SELECT c.relname FROM pg_catalog.pg_class AS c
     WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r' AND NOT c.relisshared
       AND c.relname <> 'pg_statistic'  -- (ANALYZE's, autovacuum's: user tables' are cleared)
     ORDER BY c.relname"""
_USER_RELATIONS = f"""
    FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace WHERE {_USER_SCHEMA}"""
_TABLES = f"SELECT c.oid::regclass::text {_USER_RELATIONS} AND c.relkind = 'r' ORDER BY 1"
_SEQUENCES = f"SELECT c.oid::regclass::text {_USER_RELATIONS} AND c.relkind = 'S' ORDER BY 1"
# statistics on user tables (ANALYZE's, autovacuum's): a fresh copy has none (Template.read)
_USER_STATISTICS = "FROM pg_catalog.pg_statistic WHERE starelid >= 16384"
_CLEAR_STATISTICS = f"DELETE {_USER_STATISTICS}"
# what the planner reads of a relation's size (TRUNCATE, VACUUM and ANALYZE change it in place)
_SIZES = f"SELECT c.oid, c.relpages, c.reltuples, c.relallvisible {_USER_RELATIONS} ORDER BY 1"
# ... put back as a fresh copy has them, written as VACUUM would
_SET_SIZES = """
    UPDATE pg_catalog.pg_class AS c
       SET relpages = t.pages, reltuples = t.tuples, relallvisible = t.visible
      FROM unnest(%s::oid[], %s::integer[], %s::real[], %s::integer[]) AS t(oid, pages, tuples, visible)
     WHERE c.oid = t.oid
       AND (c.relpages, c.reltuples, c.relallvisible) IS DISTINCT FROM (t.pages, t.tuples, t.visible)"""


def _xid(conn: psycopg.Connection[Any]) -> int:
    """A transaction id newer than every write committed so far (as xmin shows it: 32 bits)."""
    row = conn.execute("SELECT pg_catalog.txid_current() % 4294967296").fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class _Template:
    """What a fresh copy of the template holds, read once, from a copy made for it."""

    database: tuple[Any, ...]
    shared: tuple[Any, ...]
    catalogs: list[str]
    counts: list[int]
    tables: list[str]
    filled: dict[str, str]  # a table the template has rows in -> a digest of them
    disk: dict[str, int]  # a table -> its size with its indexes and TOAST
    sequences: dict[str, tuple[int, bool]]
    sizes: list[tuple[Any, ...]]

    @classmethod
    def read(cls, conn: psycopg.Connection[Any]) -> _Template:
        # (a template whose tables have statistics would need them kept: none of the tests' has)
        assert _one(conn, f"SELECT count(*) {_USER_STATISTICS}") == (0,), "the template's tables have statistics"
        catalogs = [r[0] for r in conn.execute(_CATALOGS)]
        tables = [r[0] for r in conn.execute(_TABLES)]
        filled = {t: d for t in tables if (d := _digest(conn, t)) is not None}
        database = _one(conn, _DATABASE_ROW)
        return cls(
            database=database[1:],
            shared=_one(conn, _SHARED, db=database[0]),
            catalogs=catalogs,
            counts=_counts(conn, catalogs, 0)[0],
            tables=tables,
            filled=filled,
            disk=_disk(conn, tables),
            sequences={s: _sequence(conn, s) for s in (r[0] for r in conn.execute(_SEQUENCES))},
            sizes=list(conn.execute(_SIZES)),
        )


def _one(conn: psycopg.Connection[Any], query: str, **params: Any) -> tuple[Any, ...]:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return tuple(row)


def _counts(conn: psycopg.Connection[Any], catalogs: list[str], since: int) -> tuple[list[int], int]:
    """Each catalog's rows, and how many of them all were written after transaction `since`."""
    query = " UNION ALL ".join(
        f"SELECT {i}, count(*), count(*) FILTER (WHERE xmin::text::bigint > %(since)s) FROM pg_catalog.{name}"
        + (" WHERE nspname !~ '^pg_(toast_)?temp_'" if name == "pg_namespace" else "")
        for i, name in enumerate(catalogs)
    )
    rows = sorted(conn.execute(query, {"since": since}))
    return [r[1] for r in rows], sum(r[2] for r in rows)


def _digest(conn: psycopg.Connection[Any], table: str) -> str | None:
    """A digest of a table's rows, or None when it has none."""
    return _one(conn, f"SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {table} AS t")[0]  # type: ignore[no-any-return]


def _disk(conn: psycopg.Connection[Any], tables: list[str]) -> dict[str, int]:
    query = "SELECT t, pg_catalog.pg_total_relation_size(t::regclass) FROM unnest(%s::text[]) AS t"
    return {t: int(n) for t, n in conn.execute(query, (tables,))}


def _counters_reset(conn: psycopg.Connection[Any]) -> None:
    """The database's statistics counters reset, this session's own reads and writes included
    (they would reach the counters when it ends: flushed first)."""
    conn.execute("SELECT pg_catalog.pg_stat_force_next_flush()")  # (at the end of this statement)
    conn.execute("SELECT pg_catalog.pg_stat_reset()")


def _sequence(conn: psycopg.Connection[Any], sequence: str) -> tuple[int, bool]:
    last, called = _one(conn, f"SELECT last_value, is_called FROM {sequence}")
    return int(last), bool(called)


@dataclass
class DatabasePool:
    """Databases copied from one template, put back for the next test instead of dropped."""

    server: str  # a URL of the server, its maintenance database
    template: str
    url: Callable[[str, str], str]  # (server URL, database name) -> that database's URL
    new_name: Callable[[], str]  # () -> a name never used
    ready: list[str] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)  # a database -> the transaction after its last reset
    changed: str = ""  # what kept the last database given back from being used again
    _template: _Template | None = None

    def new(self) -> str:
        """A database as the template made it: one put back, else a new copy."""
        return self.ready.pop() if self.ready else self._copy()

    def give_back(self, name: str, admin: psycopg.Connection[Any]) -> str | None:
        """Put a test's database back for the next one, under a new name: None when it was,
        else the name to drop it by (`changed` says why)."""
        if self._template is None:
            self._template = self._read_template()
        mark = self.marks.pop(name, None)
        if mark is None:
            self.changed = "not a copy this pool made"
            return name
        new = self.new_name()
        for _ in range(3):
            admin.execute(
                "SELECT pg_catalog.pg_terminate_backend(pid, 5000) FROM pg_catalog.pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_catalog.pg_backend_pid()",
                (name,),
            )
            try:
                admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{new}"')
                break
            except psycopg.errors.ObjectInUse:
                continue  # (a session came back between the two)
            except psycopg.errors.InvalidCatalogName:
                self.changed = "the test dropped or renamed it"
                return name
        else:
            self.changed = "sessions kept coming back"
            return name
        try:
            with psycopg.connect(self.url(self.server, new), autocommit=True) as conn:
                self.changed = self._changed(conn, mark)
                if not self.changed:
                    self.marks[new] = _xid(conn)
                    self.ready.append(new)
                    return None
        except psycopg.Error as error:
            self.changed = f"put back, {error}"
        return new

    def _copy(self) -> str:
        """A new copy of the template; what it holds from now on can be told."""
        name = self.new_name()
        with psycopg.connect(self.server, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
            self.marks[name] = _xid(admin)
        return name

    def _read_template(self) -> _Template:
        name = self._copy()
        with psycopg.connect(self.url(self.server, name), autocommit=True) as conn:
            template = _Template.read(conn)
            _counters_reset(conn)
        self.ready.append(name)
        return template

    def _changed(self, conn: psycopg.Connection[Any], since: int) -> str:
        """What changed in the database besides rows and sequences ('' for nothing), those put back."""
        t = self._template
        assert t is not None
        database = _one(conn, _DATABASE_ROW)
        if database[1:] != t.database:
            return "its pg_database row"
        if (shared := _one(conn, _SHARED, db=database[0])) != t.shared:
            return f"shared catalogs' rows: {shared}"
        counts, written = _counts(conn, t.catalogs, since)
        if counts != t.counts or written:
            more = [f"{c} {n - m:+}" for c, n, m in zip(t.catalogs, counts, t.counts, strict=True) if n != m]
            return f"its catalog: {written} rows written, {', '.join(more) or 'as many in each'}"
        # (a table emptied by a DELETE and VACUUM can keep its indexes' pages)
        disk = _disk(conn, [x for x in t.tables if x not in t.filled])
        if grown := [x for x, n in disk.items() if n != t.disk[x]]:
            conn.execute(f"TRUNCATE {', '.join(grown)} CASCADE")  # (and the tables that refer to them)
        if any(_digest(conn, table) != digest for table, digest in t.filled.items()):
            return "rows of a table the template has rows in"
        for sequence, (last, called) in t.sequences.items():
            conn.execute("SELECT pg_catalog.setval(%s::regclass, %s, %s)", (sequence, last, called))
        conn.execute(_CLEAR_STATISTICS)
        # (a TRUNCATE leaves an index one page of no rows, where the template's were never measured)
        conn.execute(_SET_SIZES, [list(column) for column in zip(*t.sizes, strict=True)])
        if _disk(conn, t.tables) != t.disk:
            return "a table's size after TRUNCATE"
        _counters_reset(conn)
        return ""
