"""Enqueue from a database trigger: every committed signup gets a welcome job.

An `after insert` trigger calls treadle.enqueue, so the job is written by the same
transaction as the row, whoever inserts it: the application, a psql session, a batch
script, another service. If the transaction rolls back, the row and its job both vanish.
This example sets the trigger up, inserts signups with plain SQL (one transaction
commits, one rolls back), and runs a worker that handles the jobs.

    DATABASE_URL=postgresql://localhost/app python examples/trigger_enqueue.py
"""

from __future__ import annotations

import os

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]

SETUP = """
create table if not exists tr_signups (
    id    bigint generated always as identity primary key,
    email text not null
);
create table if not exists tr_welcomes (
    signup_id bigint primary key references tr_signups,
    job_id    bigint not null
);

create or replace function tr_enqueue_welcome() returns trigger
language plpgsql as $$
begin
    perform treadle.enqueue('tr_send_welcome', jsonb_build_object('signup', new.id),
                            queue => 'tr-mail', idempotency_key => 'tr-welcome:' || new.id);
    return null;
end;
$$;

create or replace trigger tr_signups_welcome
after insert on tr_signups
for each row execute function tr_enqueue_welcome();
"""


def send_welcome(args: dict, ctx: treadle.JobContext) -> None:
    with psycopg.connect(DSN) as conn:
        conn.execute(
            "insert into tr_welcomes (signup_id, job_id) values (%s, %s) on conflict do nothing",
            [args["signup"], ctx.job_id],
        )
        ctx.complete_in(conn, {"welcomed": args["signup"]})


def main() -> None:
    with psycopg.connect(DSN) as conn:
        conn.execute(SETUP)

    # Plain SQL inserts: nothing here knows about treadle.
    with psycopg.connect(DSN) as conn:
        committed = [row[0] for row in conn.execute(
            "insert into tr_signups (email) values ('ada@example.com'), ('grace@example.com'),"
            " ('edsger@example.com') returning id").fetchall()]
    with psycopg.connect(DSN) as conn:
        (rolled_back,) = conn.execute(
            "insert into tr_signups (email) values ('nobody@example.com') returning id").fetchone()
        conn.rollback()

    with psycopg.connect(DSN, autocommit=True) as conn:
        jobs = dict(conn.execute(
            "select (args->>'signup')::bigint, id from treadle.jobs where name = 'tr_send_welcome'"
            " and (args->>'signup')::bigint = any(%s)", [committed + [rolled_back]]).fetchall())
    assert sorted(jobs) == sorted(committed), jobs
    print(f"the trigger enqueued jobs {sorted(jobs.values())} for signups {committed}; none for {rolled_back}")

    worker = treadle.Worker(DSN, queues=["tr-mail"])
    worker.register("tr_send_welcome", send_welcome)
    with worker, psycopg.connect(DSN, autocommit=True) as conn:
        for job_id in jobs.values():
            treadle.wait(conn, job_id, timeout=60)
        welcomed = [row[0] for row in conn.execute(
            "select signup_id from tr_welcomes where signup_id = any(%s) order by signup_id",
            [committed]).fetchall()]
    assert welcomed == sorted(committed), welcomed
    print(f"welcomed signups {welcomed}")


if __name__ == "__main__":
    main()
