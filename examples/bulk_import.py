"""A bulk import: one enqueue_many call for every batch of a file, then the results.

A product file of 1,000 rows is cut into batches of 100. One enqueue_many call inserts
a job per batch in one statement; each job has an idempotency key built from the file
and the batch, so submitting the same file again adds nothing. Workers import batches
in parallel. Each handler writes its rows and completes its job in one transaction
(ctx.complete_in), and returns what it imported and what it rejected. The results are
then read back with one query.

    DATABASE_URL=postgresql://localhost/app python examples/bulk_import.py
"""

from __future__ import annotations

import csv
import io
import os

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]
QUEUE = "imports"
BATCH = 100


def product_file() -> str:
    """1,000 products as CSV; every 97th has a negative price, which the import rejects."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["sku", "name", "price"])
    for n in range(1, 1001):
        writer.writerow([f"SKU-{n:05d}", f"Product {n}", -1 if n % 97 == 0 else n % 50 + 0.99])
    return out.getvalue()


def import_batch(args: dict, ctx: treadle.JobContext) -> None:
    good = [row for row in args["rows"] if float(row["price"]) >= 0]
    rejected = [row["sku"] for row in args["rows"] if float(row["price"]) < 0]
    with psycopg.connect(DSN) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                """insert into bi_products (sku, name, price) values (%(sku)s, %(name)s, %(price)s)
                   on conflict (sku) do update set name = excluded.name, price = excluded.price""",
                good,
            )
        ctx.complete_in(conn, {"imported": len(good), "rejected": rejected})


def submit(file_name: str, text: str) -> list[int]:
    rows = list(csv.DictReader(io.StringIO(text)))
    batches = [rows[i:i + BATCH] for i in range(0, len(rows), BATCH)]
    with psycopg.connect(DSN) as conn:
        return treadle.enqueue_many(conn, [
            {"name": "import_batch", "args": {"file": file_name, "rows": batch}, "queue": QUEUE,
             "idempotency_key": f"import:{file_name}:batch-{number}"}
            for number, batch in enumerate(batches)
        ])


def main() -> None:
    with psycopg.connect(DSN) as conn:
        conn.execute("""
            create table if not exists bi_products (
                sku   text primary key,
                name  text not null,
                price numeric not null check (price >= 0)
            )""")

    text = product_file()
    ids = submit("products-2024-06.csv", text)
    assert submit("products-2024-06.csv", text) == ids, "the same file again adds no job"
    print(f"{len(ids)} batch jobs: {ids[0]} .. {ids[-1]}")

    worker = treadle.Worker(DSN, queues=[QUEUE], concurrency=4)
    worker.register("import_batch", import_batch)
    with worker, psycopg.connect(DSN, autocommit=True) as conn:
        for job_id in ids:
            treadle.wait(conn, job_id, timeout=120)
        rows = conn.execute(
            "select id, state, result from treadle.job_details where id = any(%s) order by id", [ids]
        ).fetchall()
        (stored,) = conn.execute("select count(*) from bi_products").fetchone()

    imported = sum(result["imported"] for _, _, result in rows)
    rejected = [sku for _, _, result in rows for sku in result["rejected"]]
    print(f"imported {imported} products, rejected {len(rejected)}: {', '.join(rejected)}")
    assert all(state == "completed" for _, state, _ in rows)
    assert imported == 990 and len(rejected) == 10 and stored >= 990, (imported, rejected, stored)


if __name__ == "__main__":
    main()
