"""A workflow step with a concurrency_key (step_options), over many runs claimed by many
connections at once: the step's jobs never run more than the key's limit at a time,
the other steps are not held back, every run completes and every slot is given back."""

from __future__ import annotations

from tests.sql.sqlcalls import Connect
from tests.sql.test_sql_key_lanes import drain, intervals_by_key, most_at_once

RUNS = 40
LIMIT = 3


def test_a_keyed_step_over_many_runs_never_runs_more_than_its_key_limit(connect: Connect) -> None:
    setup = connect()
    setup.execute("select treadle.set_queue('wk', key_limit => %s)", (LIMIT,))
    setup.execute(
        """select treadle.define_workflow('render', array['prep', 'gpu', 'post'],
                                          step_options => '{"gpu": {"concurrency_key": "gpu-0"}}')"""
    )
    setup.execute("select treadle.start_workflow('render', queue => 'wk') from generate_series(1, %s)", (RUNS,))
    by_key = intervals_by_key(setup, "wk", drain(connect, "wk"))
    assert setup.execute(
        "select count(*) from treadle.workflow_runs where name = 'render' and state = 'completed'"
    ).fetchone() == (RUNS,)
    assert setup.execute(
        "select step, count(*) from treadle.jobs where queue = 'wk' and concurrency_key = 'gpu-0' group by step"
    ).fetchall() == [("gpu", RUNS)], "every gpu step job carried the key, and no other step's"
    assert set(by_key) == {"gpu-0", None}
    assert len(by_key["gpu-0"]) == RUNS
    assert most_at_once(by_key["gpu-0"]) <= LIMIT, f"the keyed step ran more than {LIMIT} at once"
    assert setup.execute("select count(*) from treadle.key_slots").fetchone() == (0,)


def test_a_keyed_step_releases_exactly_its_key_limit(connect: Connect) -> None:
    """Once every run's first step is done, LIMIT of the keyed steps are claimable and the
    rest wait blocked: the limit is reached, not only never passed (whatever the timing)."""
    conn = connect()
    conn.execute("select treadle.set_queue('wr', key_limit => %s)", (LIMIT,))
    conn.execute(
        """select treadle.define_workflow('render2', array['prep', 'gpu'],
                                          step_options => '{"gpu": {"concurrency_key": "gpu-1"}}')"""
    )
    conn.execute("select treadle.start_workflow('render2', queue => 'wr') from generate_series(1, %s)", (RUNS,))
    claimed = conn.execute(
        "select id, lease_token from treadle.claim('w', array['wr'],"
        " names => array['workflow:render2/prep'], batch => %s)",
        (RUNS,),
    ).fetchall()
    assert len(claimed) == RUNS
    for job_id, token in claimed:
        conn.execute("select treadle.complete(%s, %s)", (job_id, token))
    assert conn.execute(
        "select state, count(*) from treadle.jobs where queue = 'wr' and step = 'gpu' group by state order by state"
    ).fetchall() == [("available", LIMIT), ("blocked", RUNS - LIMIT)]
    assert conn.execute("select held from treadle.key_slots where queue = 'wr' and key = 'gpu-1'").fetchone() == (
        LIMIT,
    )
