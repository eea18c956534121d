"""The PgBouncer fixtures (defined in fixtures.py, so that other test directories can import them too)."""

from tests.pgbouncer.fixtures import bouncer_dsn, pgbouncer_url  # noqa: F401
