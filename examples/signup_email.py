"""A welcome email sent once per user, however often the signup is submitted.

The signup and its email job commit in one transaction. The job's idempotency key is
built from the user's id, so a form submitted twice, or a request retried by a proxy,
still makes one job. The handler records the email in the same transaction that
completes the job (ctx.complete_in), so even a handler that runs twice sends once.

Run it with DATABASE_URL naming a database where `create extension treadle` was done:

    DATABASE_URL=postgresql://localhost/app python examples/signup_email.py
"""

from __future__ import annotations

import os

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]
QUEUE = "signup-email"


def setup() -> None:
    with psycopg.connect(DSN) as conn:
        conn.execute("""
            create table if not exists signup_users (
                id    bigint generated always as identity primary key,
                email text not null unique
            )""")
        conn.execute("""
            create table if not exists signup_emails_sent (
                user_id bigint primary key references signup_users,
                sent_to text not null,
                job_id  bigint not null
            )""")


def sign_up(email: str) -> tuple[int, int]:
    """Save the user and enqueue the welcome email in one transaction; (user id, job id)."""
    with psycopg.connect(DSN) as conn:
        (user_id,) = conn.execute(
            """insert into signup_users (email) values (%s)
               on conflict (email) do update set email = excluded.email
               returning id""",
            [email],
        ).fetchone()
        job_id = treadle.enqueue(
            conn,
            "send_welcome_email",
            {"user_id": user_id},
            queue=QUEUE,
            idempotency_key=f"welcome-email:user-{user_id}",
        )
    return user_id, job_id


def send_welcome_email(args: dict, ctx: treadle.JobContext) -> None:
    with psycopg.connect(DSN) as conn:
        (email,) = conn.execute(
            "select email from signup_users where id = %s", [args["user_id"]]
        ).fetchone()
        # Here a real handler calls the mail provider, passing f"job-{ctx.job_id}" as the
        # provider's idempotency key. This example records the email instead.
        conn.execute(
            "insert into signup_emails_sent (user_id, sent_to, job_id) values (%s, %s, %s)",
            [args["user_id"], email, ctx.job_id],
        )
        ctx.complete_in(conn, {"sent_to": email})


def main() -> None:
    setup()
    ada, ada_job = sign_up("ada@example.com")
    ada_again, ada_job_again = sign_up("ada@example.com")  # the form, submitted twice
    grace, grace_job = sign_up("grace@example.com")
    assert (ada_again, ada_job_again) == (ada, ada_job), "one user, one job"

    worker = treadle.Worker(DSN, queues=[QUEUE], concurrency=4)
    worker.register("send_welcome_email", send_welcome_email)
    with worker:
        for job_id in (ada_job, grace_job):
            print(f"job {job_id}:", treadle.wait(DSN, job_id, timeout=60))

    with psycopg.connect(DSN) as conn:
        sent = conn.execute(
            "select user_id, count(*) from signup_emails_sent where user_id in (%s, %s) group by user_id",
            [ada, grace],
        ).fetchall()
    assert sorted(sent) == [(ada, 1), (grace, 1)], sent
    print("each user got exactly one welcome email")


if __name__ == "__main__":
    main()
