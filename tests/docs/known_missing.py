"""What the docs say treadle does not do (yet), and how a test knows it is still so.

tests/docs/test_release_check.py (make release-check; make test runs it too) finds
every statement in README.md and docs/ that says "not yet", "not ... yet", "does not
exist", "missing" or "planned" (outside code blocks; each item of a list counts alone,
every item when the list's lead-in says it). Each must contain the `says` of an entry
below (whitespace aside), and every entry's `says` must still be on its page:

  MISSING           a feature the page says is missing. `sql`: a query, run on a fresh
                    database with treadle, that returns true while the feature is
                    missing; or `python`: a regular expression that matches nothing in
                    python/src/treadle while it is missing. When the check fails, the
                    feature exists: say so on the page and drop the entry.
  NOT_A_FEATURE     a statement with one of those words that is not about a missing
                    feature; `why` says what it is about.
"""

from __future__ import annotations

MISSING: list[dict[str, str]] = [
    {
        "page": "docs/comparison.md",
        "says": "tags on jobs",
        "sql": """SELECT NOT EXISTS (SELECT 1 FROM information_schema.columns
                             WHERE table_schema = 'treadle' AND table_name = 'jobs'
                               AND column_name ~* 'tag')""",
    },
    {
        "page": "docs/comparison.md",
        "says": "a test mode that runs jobs inline without a database",
        "python": "(?i)def run_inline|inline_mode|InlineWorker|testing_mode",
    },
]

NOT_A_FEATURE: list[dict[str, str]] = [
    {
        "page": "README.md",
        "says": "installs what it needs when it is missing",
        "why": "the tools make test installs",
    },
    {
        "page": "docs/cli.md",
        "says": "`--yes` is missing",
        "why": "a command line option left out",
    },
    {
        "page": "docs/comparison.md",
        "says": "What treadle has that this page once listed as missing",
        "why": "the list of what exists now",
    },
    {
        "page": "docs/retries.md",
        "says": "one that does not exist (discarded",
        "why": "a report in the example that does not exist",
    },
    {
        "page": "docs/sql-api.md",
        "says": "a missing key takes",
        "why": "the argument objects of enqueue_many",
    },
    {
        "page": "docs/cli.md",
        "says": "(not due yet,",
        "why": "why a job waits",
    },
    {
        "page": "docs/operations.md",
        "says": "reasons: not due yet,",
        "why": "why a job waits",
    },
    {
        "page": "docs/operations.md",
        "says": "schema `treadle` is not there yet",
        "why": "what the plain install checks first",
    },
    {
        "page": "docs/python-api.md",
        "says": "(a missing grant,",
        "why": "a refusal by the database",
    },
    {
        "page": "docs/retries.md",
        "says": "a record another system has not written yet",
        "why": "what a snoozing handler waits for",
    },
    {
        "page": "docs/sql-api.md",
        "says": "for a step not enqueued yet",
        "why": "the state of a workflow step",
    },
]

# Versions of other projects that the docs print beside treadle's.
OTHER_VERSION: list[dict[str, str]] = [
    {
        "page": "docs/getting-started.md",
        "says": "pgserver 0.1.4",
    },
    {
        "page": "README.md",
        "says": "pg_tle 1.5.2",
    },
    {
        "page": "docs/operations.md",
        "says": "pg_tle 1.5.2",
    },
    {
        "page": "README.md",
        "says": "Citus 13.2.2",
    },
    {
        "page": "docs/citus.md",
        "says": "Citus 13.2.2",
    },
    {
        "page": "docs/comparison.md",
        "says": "| 2.30.0 (August 2026) |",
    },
    {
        "page": "docs/comparison.md",
        "says": "| 0.4.0 (June 2026) |",
    },
]
