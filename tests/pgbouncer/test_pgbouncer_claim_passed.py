"""The claim's memory of the queues its probe passed (treadle.claim_passed), through PgBouncer.

The memory is a setting of the server's session, and behind a transaction-mode pooler one
server session serves many clients in turn: a claim of one client goes past the queues
another client's probe passed. It may do so only where those queues held no claimable row
for the probing snapshot: every row made claimable since (a commit after the probe, one
running while it read, the claiming transaction's own) ends the memory, whichever client
made it. Clients here take turns at random (enqueues due and not due, claims, an enqueue and
a claim in one transaction, a transaction held open across others' claims), and after each
claim a direct connection checks what the claim went past: no queue before the one it took
from, in its turn order, holds a due row (every row is due at once or in an hour, so none
becomes due by time meanwhile, the one thing the memory may wait a second for).
"""

from __future__ import annotations

import random
from typing import Any

import psycopg

from tests.sql.sqlcalls import claim_plainly

QUEUES = [f"pb-{i}" for i in range(60)]
STEPS = 400
CLAIM = "SELECT queue, id FROM treadle.claim('w', %s::text[])"


def due_queues(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT DISTINCT queue FROM treadle.jobs WHERE state = 'available' AND run_at <= now()"
    ).fetchall()
    return {r[0] for r in rows}


def enqueue(client: psycopg.Connection[Any], queue: str, due: bool) -> None:
    client.execute(
        "SELECT treadle.enqueue('work', '{}'::jsonb, queue => %s, run_at => now() + %s::interval)",
        (queue, "0 seconds" if due else "1 hour"),
    )


def test_a_claim_goes_past_only_queues_without_a_claimable_row_whichever_client_probed(
    conn: psycopg.Connection[Any], bouncer_dsn: str
) -> None:
    rng = random.Random(25)
    clients = [psycopg.connect(bouncer_dsn, autocommit=True, prepare_threshold=None) for _ in range(3)]
    held = psycopg.connect(bouncer_dsn, prepare_threshold=None)  # a transaction left open across steps
    held_open = False
    written_by: dict[str, int] = {}  # a memory's value: the client whose claim wrote it
    used_from_another = 0  # claims that found a memory another client's claim wrote
    claims = 0
    try:
        for _ in range(STEPS):
            action = rng.random()
            c = rng.randrange(len(clients))
            client = clients[c]
            if action < 0.3:
                enqueue(client, rng.choice(QUEUES), due=rng.random() < 0.7)
                continue
            if action < 0.38:
                if held_open:
                    held.commit()
                else:
                    held.execute("SELECT pg_current_xact_id()")  # an id before the next probes' snapshots
                    enqueue(held, rng.choice(QUEUES), due=True)
                held_open = not held_open
                continue
            with client.transaction():
                if action < 0.45:  # a row of the claim's own transaction, made before its claim
                    enqueue(client, rng.choice(QUEUES), due=True)
                claim_plainly(client, QUEUES)  # (the path whose probe keeps claim_passed)
                turn, memory = client.execute(
                    "SELECT coalesce(current_setting('treadle.claim_turn', true), ''),"
                    " coalesce(current_setting('treadle.claim_passed', true), '')"
                ).fetchone()  # type: ignore[misc]
                got = client.execute(CLAIM, (QUEUES,)).fetchall()
                after = client.execute("SELECT current_setting('treadle.claim_passed', true)").fetchone()[0]  # type: ignore[index]
            claims += 1
            if memory in written_by and written_by[memory] != c:
                used_from_another += 1
            if after and after != memory:
                written_by[after] = c
            first = int(turn) if turn else 0
            order = QUEUES[first:] + QUEUES[:first]
            went_past = order if not got else order[: order.index(got[0][0])]
            assert not due_queues(conn) & set(went_past), (got, turn, memory)
    finally:
        held.rollback()
        held.close()
        for client in clients:
            client.close()
    assert claims > 100
    assert used_from_another > 10, "claims went past queues another client's probe passed"
