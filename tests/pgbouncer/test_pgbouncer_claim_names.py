"""The claim's job names through PgBouncer in transaction mode: clients share server sessions, and
with them the session's record of the names list last checked (treadle.claim_names_checked)."""

from __future__ import annotations

import psycopg
import pytest

CLAIM = "select count(*) from treadle.claim('w', array['pooled-names'], names => %s)"


def test_a_client_gets_its_own_refusal_on_a_session_another_client_checked(bouncer_dsn: str) -> None:
    """Client A's valid list checked on a server session lets client B, on that same session, through
    with nothing but that list: B's changed list is refused (22023), its locks none."""
    with psycopg.connect(bouncer_dsn, autocommit=True, prepare_threshold=None) as a:
        a.execute("select treadle.enqueue('a', '{}', queue => 'pooled-names')")
        assert a.execute(CLAIM, (["a", "b"],)).fetchone() == (1,)
        pid = a.execute("select pg_backend_pid()").fetchone()
    with psycopg.connect(bouncer_dsn, autocommit=True, prepare_threshold=None) as b:
        assert b.execute("select pg_backend_pid()").fetchone() == pid, "B runs on A's server session"
        assert b.execute("select current_setting('treadle.claim_names_checked', true)").fetchone() != (None,)
        b.execute("select treadle.enqueue('a', '{}', queue => 'pooled-names')")
        for bad in (["a", "b\t"], ["a", "b", ""], ["a", None], ["b", "a" * 411]):
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                b.execute(CLAIM, (bad,))
        assert b.execute(CLAIM, (["b", "a"],)).fetchone() == (1,)
