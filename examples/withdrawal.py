"""A money withdrawal as a three-step workflow whose completed steps survive a crash.

    reserve  put a hold on the account          (a database write: complete_in)
    send     ask the bank to transfer the money (an external call, keyed on the withdrawal)
    settle   take the money and release the hold (a database write: complete_in)

A first worker process runs `reserve`, then dies inside `send`, right after the bank
accepted the transfer and before the step's completion was written: the process ends
with os._exit, as a SIGKILL or a power cut would end it. Once its lease expires, a second
worker rescues the job and runs `send` again, then `settle`. `reserve` never runs again:
its completion was committed together with the job for `send`. `send` does run twice, so
it passes the bank a key built from the withdrawal; the bank makes one transfer.

    DATABASE_URL=postgresql://localhost/app python examples/withdrawal.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]
QUEUE = "withdrawals"
CRASH_IN_SEND = "--crash-in-send" in sys.argv


def setup() -> None:
    with psycopg.connect(DSN) as conn:
        conn.execute("""
            create table if not exists wd_accounts (
                id      bigint primary key,
                balance numeric not null,
                held    numeric not null default 0,
                check (held >= 0 and held <= balance)
            )""")
        conn.execute("""
            create table if not exists wd_withdrawals (
                id      bigint generated always as identity primary key,
                account bigint not null references wd_accounts,
                amount  numeric not null,
                state   text not null default 'requested'
            )""")
        # The bank's side: one transfer per reference, however often it is asked.
        conn.execute("""
            create table if not exists wd_bank_transfers (
                reference text primary key,
                amount    numeric not null
            )""")
        # A log of every time a step function was called, to count them.
        conn.execute("create table if not exists wd_step_calls (run_id bigint, step text, attempt int)")
        conn.execute("insert into wd_accounts values (42, 500) on conflict do nothing")


def log_call(ctx: treadle.JobContext) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("insert into wd_step_calls values (%s, %s, %s)", [ctx.run_id, ctx.step, ctx.attempt])


def reserve(input: dict, ctx: treadle.JobContext) -> None:
    log_call(ctx)
    with psycopg.connect(DSN) as conn:
        conn.execute(
            "update wd_accounts set held = held + %s where id = %s",
            [input["amount"], input["account"]],
        )
        conn.execute("update wd_withdrawals set state = 'reserved' where id = %s", [input["withdrawal"]])
        ctx.complete_in(conn, {"held": input["amount"]})


def send(input: dict, ctx: treadle.JobContext) -> dict:
    log_call(ctx)
    reference = f"withdrawal-{input['withdrawal']}"
    with psycopg.connect(DSN) as bank:  # stands in for the bank's API
        bank.execute(
            "insert into wd_bank_transfers values (%s, %s) on conflict (reference) do nothing",
            [reference, ctx.results["reserve"]["held"]],
        )
    if CRASH_IN_SEND:
        os._exit(1)  # the process dies: the bank has the transfer, treadle has no completion
    return {"reference": reference}


def settle(input: dict, ctx: treadle.JobContext) -> None:
    log_call(ctx)
    with psycopg.connect(DSN) as conn:
        conn.execute(
            "update wd_accounts set balance = balance - %s, held = held - %s where id = %s",
            [input["amount"], input["amount"], input["account"]],
        )
        conn.execute("update wd_withdrawals set state = 'settled' where id = %s", [input["withdrawal"]])
        ctx.complete_in(conn, {"settled": ctx.results["send"]["reference"]})


def make_worker(**options: object) -> treadle.Worker:
    worker = treadle.Worker(DSN, queues=[QUEUE], **options)
    worker.workflow("withdraw", [treadle.Step("reserve", reserve), treadle.Step("send", send),
                                 treadle.Step("settle", settle)])
    return worker


def wait_for_run(run_id: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    with psycopg.connect(DSN, autocommit=True) as conn:
        while True:
            (state,) = conn.execute("select state from treadle.workflow_runs where id = %s", [run_id]).fetchone()
            if state != "running" or time.monotonic() > deadline:
                return state
            time.sleep(0.1)


def main() -> None:
    setup()
    with psycopg.connect(DSN) as conn:
        (balance_before,) = conn.execute("select balance from wd_accounts where id = 42").fetchone()
        (withdrawal,) = conn.execute(
            "insert into wd_withdrawals (account, amount) values (42, 100) returning id"
        ).fetchone()
        run_id = treadle.start_workflow(
            conn, "withdraw", {"withdrawal": withdrawal, "account": 42, "amount": 100},
            steps=["reserve", "send", "settle"], queue=QUEUE,
            idempotency_key=f"withdrawal-{withdrawal}",
        )

    # A worker process with a short lease, which dies inside `send`.
    crashed = subprocess.run([sys.executable, __file__, "--crash-in-send"], timeout=120)
    assert crashed.returncode == 1, crashed.returncode
    print(f"run {run_id}: the first worker died inside step 'send'")

    # Another worker: its rescue returns the dead worker's job once that lease expired.
    with make_worker(rescue_interval=0.5):
        state = wait_for_run(run_id, timeout=60)

    with psycopg.connect(DSN) as conn:
        calls = conn.execute(
            "select step, count(*) from wd_step_calls where run_id = %s group by step order by step", [run_id]
        ).fetchall()
        transfers = conn.execute(
            "select count(*) from wd_bank_transfers where reference = %s", [f"withdrawal-{withdrawal}"]
        ).fetchone()[0]
        (balance_after, held) = conn.execute("select balance, held from wd_accounts where id = 42").fetchone()
        results = treadle.workflow_results(conn, run_id)
    print(f"run {run_id}: {state}; step calls {dict(calls)}; results {results}")
    assert state == "completed", state
    assert dict(calls) == {"reserve": 1, "send": 2, "settle": 1}, calls
    assert transfers == 1, transfers
    assert (balance_before - balance_after, held) == (100, 0), (balance_before, balance_after, held)
    print("reserve ran once, the bank made one transfer, the account paid once")


if __name__ == "__main__":
    if CRASH_IN_SEND:
        make_worker(lease=2, heartbeat_interval=0.5).run()
    else:
        main()
