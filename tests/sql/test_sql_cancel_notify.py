"""treadle.cancel of a running job tells its worker at once: NOTIFY treadle_cancel with the
job id, sent when the cancel commits (never when it rolls back), and only when a cancel
request was recorded."""

from __future__ import annotations

import psycopg

from tests.sql.sqlcalls import Connect, row, value


def heard(listener: psycopg.Connection) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in listener.notifies(timeout=0.5, stop_after=10)]


def test_a_cancel_of_a_running_job_notifies_its_id_once_committed(connect: Connect) -> None:
    listener, canceller = connect(), connect(autocommit=False)
    listener.execute("LISTEN treadle_cancel")
    running = value(canceller, "select treadle.enqueue('long', queue => 'cn')")
    waiting = value(canceller, "select treadle.enqueue('later', queue => 'cn-later')")
    job_id, _ = row(canceller, "select id, lease_token from treadle.claim('w', array['cn'])")
    assert job_id == running
    canceller.commit()

    assert value(canceller, "select treadle.cancel(%s)", (running,)) is True
    canceller.rollback()
    assert heard(listener) == [], "a cancel rolled back is never announced"

    assert value(canceller, "select treadle.cancel(%s)", (running,)) is True
    assert value(canceller, "select treadle.cancel(%s)", (waiting,)) is True  # waiting: cancelled at once
    canceller.commit()
    assert heard(listener) == [("treadle_cancel", str(running))]

    assert value(canceller, "select treadle.cancel(%s)", (running,)) is False  # asked already
    canceller.commit()
    assert heard(listener) == []
