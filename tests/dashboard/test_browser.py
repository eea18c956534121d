"""The dashboard in a real headless Chromium, served by a real server on 127.0.0.1.

Debian's chromium package (/usr/bin/chromium) is driven by Playwright; no browser
is downloaded. The overview's screenshot lands in test-artifacts/ for a person to see.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Locator, Page, expect, sync_playwright
from werkzeug.serving import make_server

from tests.conftest import as_role
from tests.dashboard.seeding import (
    DEEP_JSON,
    XSS_ARGS,
    XSS_ERROR,
    XSS_NAME,
    Seeded,
    claim,
    complete,
    deep_rows,
    enqueue,
    fail_with_traceback,
    job_state,
    lease_token,
)
from tests.markers import marks_users
from treadle.dashboard import create_app, dashboard_of

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
XSS_MARKERS = "[window.__xss_name, window.__xss_args, window.__xss_error]"

expect.set_options(timeout=20_000)
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
@marks_users(pytest.mark.browser)
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Served:
    """The dashboard on a werkzeug server thread; stop() takes it off the network."""

    def __init__(self, dsn: str, refresh_seconds: float = 1, read_only: bool = False) -> None:
        self.app = create_app(dsn, refresh_seconds=refresh_seconds, read_only=read_only)
        self.server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()


@pytest.fixture
def served(operator_dsn: str) -> Iterator[Served]:
    server = Served(operator_dsn)
    yield server
    server.stop()
    dashboard_of(server.app).close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []
    refused: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    def on_console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    opened.on("dialog", on_dialog)
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.on("console", on_console)
    yield opened
    context.close()
    assert dialogs == [], "a page opened a dialog"
    assert errors == [], "the page's script raised"
    assert refused == [], "the Content-Security-Policy blocked something the page needs"


def row(page: Page, section: str, text: str) -> Locator:
    return page.locator(f"#{section} tr", has_text=text)


def test_overview_renders_every_part_and_markup_stays_text(page: Page, served: Served, seeded: Seeded) -> None:
    page.goto(served.url)
    expect(page.locator("#states")).to_contain_text("discarded")
    expect(page.locator("#queues")).to_contain_text("billing")
    expect(page.locator("#failures")).to_contain_text(XSS_NAME)  # the name, shown as text
    expect(page.locator("#failures")).to_contain_text(XSS_ERROR.splitlines()[0])
    expect(page.locator("#runs")).to_contain_text("signup")
    expect(page.locator("#workers")).to_contain_text("worker-a")
    assert page.locator("#throughput svg g.minute").count() == 60
    assert page.locator("#failures img, #failures script").count() == 0
    assert page.evaluate(XSS_MARKERS) == [None, None, None]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)

    page.goto(f"{served.url}jobs/{seeded.xss}")
    expect(page.locator("#job pre.json").first).to_contain_text(XSS_ARGS["html"])
    expect(page.locator("#job #attempts")).to_contain_text(XSS_ERROR.splitlines()[0])
    assert page.locator("#job img, #job script").count() == 0
    assert page.evaluate(XSS_MARKERS) == [None, None, None]
    page.screenshot(path=str(ARTIFACTS / "dashboard-job.png"), full_page=True)


def test_pages_of_payloads_too_deep_to_decode_show_their_text(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    deep = deep_rows(conn)
    page.goto(f"{served.url}jobs/{deep.job}")
    expect(page.locator("#job h1")).to_contain_text("workflow:legacy")
    shown = page.locator("#job pre.json")
    expect(shown).to_have_count(3)  # args, result, and the error history
    assert shown.nth(0).inner_text() == shown.nth(1).inner_text() == DEEP_JSON
    assert DEEP_JSON in shown.nth(2).inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-deep-job.png"), full_page=True)

    page.goto(f"{served.url}runs/{deep.run}")
    expect(page.locator("#run table.steps")).to_contain_text(DEEP_JSON[:150])
    assert page.locator("#run pre.json").inner_text() == DEEP_JSON
    page.screenshot(path=str(ARTIFACTS / "dashboard-deep-run.png"), full_page=True)

    page.goto(f"{served.url}jobs/{seeded.running}")
    expect(page.locator("#job")).to_contain_text("Lease until")
    assert lease_token(conn, seeded.running) not in page.content()


def test_the_full_error_opens_on_demand(page: Page, served: Served, seeded: Seeded) -> None:
    page.goto(served.url)
    details = row(page, "failures", "sync_crm").locator("details")
    expect(details.locator("pre")).not_to_be_visible()
    details.locator("summary").click()
    expect(details.locator("pre")).to_be_visible()
    expect(details.locator("pre")).to_contain_text("at sync_crm()")
    shown = page.locator("#updated").inner_text()
    expect(page.locator("#updated")).not_to_have_text(shown)  # a refresh replaced the section...
    expect(row(page, "failures", "sync_crm").locator("details pre")).to_be_visible()  # ...and kept it open


def test_a_traceback_shows_its_exception_and_opens_whole(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    job_id = fail_with_traceback(conn)
    page.goto(served.url)
    details = row(page, "failures", "parse_feed").locator("details")
    expect(details.locator("summary")).to_have_text("ValueError: feed 7 has no items")
    expect(details.locator("pre")).not_to_be_visible()
    details.locator("summary").click()
    expect(details.locator("pre")).to_be_visible()
    expect(details.locator("pre")).to_contain_text("Traceback (most recent call last):")
    expect(details.locator("pre")).to_contain_text("KeyError: 'items'")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-traceback-overview.png"), full_page=True)

    page.goto(f"{served.url}jobs?queue=feeds")
    expect(page.locator("#results tr", has_text="parse_feed")).to_contain_text("ValueError: feed 7 has no items")
    page.goto(f"{served.url}jobs/{job_id}")
    attempt = page.locator("#job #attempts details")
    expect(attempt.locator("summary")).to_have_text("ValueError: feed 7 has no items")
    attempt.locator("summary").click()
    history = attempt.locator("pre")
    expect(history).to_contain_text("The above exception was the direct cause of the following exception:")
    expect(history).to_contain_text("ValueError: feed 7 has no items")
    page.screenshot(path=str(ARTIFACTS / "dashboard-traceback-job.png"), full_page=True)


def test_retry_and_cancel_change_the_state(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    page.goto(served.url)
    row(page, "failures", "charge_card").get_by_role("button", name="Retry now").click()
    expect(page.locator("#notice")).to_contain_text(f"Job {seeded.discarded} will run again now.")
    expect(row(page, "failures", "charge_card")).to_have_count(0)
    assert job_state(conn, seeded.discarded) == "available"

    row(page, "failures", "sync_crm").get_by_role("button", name="Cancel").click()
    expect(page.locator("#notice")).to_contain_text(f"Job {seeded.retryable} cancelled.")
    expect(row(page, "failures", "sync_crm")).to_have_count(0)
    assert job_state(conn, seeded.retryable) == "cancelled"

    page.goto(f"{served.url}jobs/{seeded.running}")
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator("#notice")).to_contain_text("Cancel requested")
    expect(page.locator("#job .flag")).to_have_text("cancel requested")
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)


def test_an_action_that_no_longer_applies_says_so(
    page: Page, operator_dsn: str, conn: psycopg.Connection, seeded: Seeded
) -> None:
    served = Served(operator_dsn, refresh_seconds=3600)  # the page stays as loaded until the click
    try:
        page.goto(served.url)
        button = row(page, "failures", "charge_card").get_by_role("button", name="Retry now")
        expect(button).to_be_visible()
        conn.execute("SELECT treadle.retry(%s)", (seeded.discarded,))  # someone else was quicker
        button.click()
        expect(page.locator("#notice")).to_contain_text(
            f"Did not apply: Job {seeded.discarded} was not retried: it is available"
        )
        expect(row(page, "failures", "charge_card")).to_have_count(0)  # and the page caught up
    finally:
        served.stop()
        dashboard_of(served.app).close()


def test_a_workflow_run_opens_to_its_steps_and_retries_one(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    page.goto(served.url)
    page.locator(f'#runs a[data-run="{seeded.failed_run}"]').click()
    expect(page).to_have_url(re.compile(rf"#run={seeded.failed_run}$"))
    steps = page.locator("#runs table.steps")
    expect(steps).to_contain_text("reserve")
    expect(steps.locator("tr", has_text="charge")).to_contain_text("discarded")
    expect(steps.locator("tr", has_text="ship")).to_contain_text("pending")

    steps.get_by_role("button", name="Retry step").click()
    expect(page.locator("#notice")).to_contain_text(f"Job {seeded.failed_step} will run again now.")
    expect(page.locator(f'#runs a[data-run="{seeded.failed_run}"]').locator("xpath=ancestor::tr")).to_contain_text(
        "running"
    )
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", (seeded.failed_run,)).fetchone() == (
        "running",
    )

    page.locator(f'#runs a[data-run="{seeded.failed_run}"]').click()  # a second click closes it
    expect(page.locator("#runs table.steps")).to_have_count(0)


def test_a_deep_link_opens_the_run(page: Page, served: Served, seeded: Seeded) -> None:
    page.goto(f"{served.url}#run={seeded.failed_run}")
    expect(page.locator("#runs table.steps")).to_contain_text("PaymentError: card expired")
    page.goto(f"{served.url}#run=424242")
    expect(page.locator("#notice")).to_contain_text("There is no workflow run 424242.")


def test_the_page_refreshes_itself_only_while_visible(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    page.goto(served.url)
    available = page.locator("#states a", has_text="available").locator("b")
    expect(available).to_have_text("2")
    enqueue(conn, "late_arrival", "mail")
    expect(available).to_have_text("3")  # no reload: the refresh brought it

    page.evaluate("() => { Object.defineProperty(document, 'hidden', { value: true, configurable: true }); }")
    page.wait_for_timeout(1500)  # let a refresh already under way land
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    enqueue(conn, "unseen", "mail")
    page.wait_for_timeout(3500)  # three refresh periods
    assert requests == [] and available.inner_text() == "3"
    page.evaluate(
        "() => { Object.defineProperty(document, 'hidden', { value: false, configurable: true });"
        " document.dispatchEvent(new Event('visibilitychange')); }"
    )
    expect(available).to_have_text("4")


def test_a_lost_server_is_announced(page: Page, served: Served, seeded: Seeded) -> None:
    page.goto(served.url)
    expect(page.locator("#updated")).to_contain_text("Updated")
    served.stop()
    expect(page.locator("#notice")).to_contain_text("Cannot reach the dashboard; showing data from")
    expect(page.locator("#states")).to_contain_text("available")  # the last data stays


# --- the pages for incidents: search, attempts, bulk actions, the queue page ---------------


def test_search_by_args_and_error_text_says_what_it_read(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    wanted = enqueue(conn, "invoice", "bills", '{"user": {"id": 42}, "plan": "pro"}')
    enqueue(conn, "invoice", "bills", '{"user": {"id": 7}, "plan": "pro"}')
    page.goto(f"{served.url}jobs")
    page.get_by_label("Args contain (JSON)").fill('{"user": {"id": 42}}')
    page.get_by_role("button", name="Search").click()
    results = page.locator("#results tbody tr")
    expect(results).to_have_count(1)
    expect(results).to_contain_text(f"#{wanted}")
    expect(page.locator("#window")).to_contain_text("only the 100,000 newest jobs")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-search-args.png"), full_page=True)

    page.get_by_label("Args contain (JSON)").fill("")
    page.get_by_label("Error text").fill("INSUFFICIENT")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#results tbody tr")).to_have_count(1)
    expect(page.locator("#results tbody tr")).to_contain_text("CardDeclined: insufficient funds")

    page.goto(f"{served.url}jobs?args=not-json")
    expect(page.locator(".error-message")).to_contain_text("this is not JSON")


def test_a_jobs_attempts_show_worker_start_end_and_error(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    job_id = fail_with_traceback(conn)  # attempt 1 fails with a traceback
    conn.execute("SELECT treadle.retry(%s)", (job_id,))
    claimed = conn.execute("SELECT id FROM treadle.claim('worker-b', ARRAY['feeds'])").fetchone()
    assert claimed == (job_id,)
    page.goto(f"{served.url}jobs/{job_id}")
    rows = page.locator("#attempts tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("worker-b")
    expect(rows.nth(0)).to_contain_text("running")
    expect(rows.nth(1).locator("summary")).to_have_text("ValueError: feed 7 has no items")
    rows.nth(1).locator("summary").click()
    expect(rows.nth(1).locator("pre")).to_contain_text("KeyError: 'items'")
    expect(rows.nth(1)).to_contain_text("worker-a")  # each failed attempt keeps its worker
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-attempts.png"), full_page=True)


def discard_many(conn: psycopg.Connection, jobs: int, queue: str) -> None:
    conn.execute(
        "SELECT treadle.enqueue('sync_account', jsonb_build_object('account', g), %s, max_attempts => 1)"
        "  FROM generate_series(1, %s) AS g",
        (queue, jobs),
    )
    while conn.execute(
        "SELECT count(treadle.fail(c.id, c.lease_token, 'ConnectionRefusedError: db down', interval '1 hour'))"
        "  FROM treadle.claim('worker-outage-1', ARRAY[%s], batch => 500) AS c",
        (queue,),
    ).fetchone() != (0,):
        pass


def count_states(conn: psycopg.Connection, queue: str) -> dict[str, int]:
    rows = conn.execute("SELECT state, count(*) FROM treadle.jobs WHERE queue = %s GROUP BY state", (queue,))
    return {state: int(n) for state, n in rows}


def test_bulk_retry_of_a_filtered_set(page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded) -> None:
    discard_many(conn, 1100, "outage")
    page.goto(f"{served.url}jobs?queue=outage&state=discarded&error=refused")
    page.get_by_role("link", name="Retry all matching…").click()
    expect(page.locator("h1")).to_have_text("Retry 1,100 jobs?")
    expect(page.locator("#bulk-confirm")).to_contain_text("error=refused")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-bulk-confirm.png"), full_page=True)
    assert count_states(conn, "outage") == {"discarded": 1100}  # the confirmation changed nothing

    page.get_by_role("button", name="Retry 1,100 jobs").click()
    expect(page.locator("#notice")).to_contain_text("1,100 of 1,100 jobs retried in 3 batches.")
    expect(page).to_have_url(re.compile(r"/jobs\?queue=outage&state=discarded&error=refused$"))
    expect(page.locator("#results")).to_contain_text("No job matches")
    page.screenshot(path=str(ARTIFACTS / "dashboard-bulk-done.png"), full_page=True)
    assert count_states(conn, "outage") == {"available": 1100}


def test_bulk_cancel_of_a_filtered_set(page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded) -> None:
    for n in range(4):
        enqueue(conn, "render", "renders", f'{{"page": {n}}}')
    page.goto(f'{served.url}jobs?queue=renders&args={{"page": 2}}')
    expect(page.locator("#results tbody tr")).to_have_count(1)
    page.get_by_role("link", name="Cancel all matching…").click()
    expect(page.locator("h1")).to_have_text("Cancel 1 job?")
    page.get_by_role("button", name="Cancel 1 job").click()
    expect(page.locator("#notice")).to_contain_text("1 of 1 jobs cancelled")
    assert count_states(conn, "renders") == {"available": 3, "cancelled": 1}


def test_bulk_actions_as_a_read_only_dashboard_and_as_a_tenant(
    page: Page,
    dsn: str,
    reader_dsn: str,
    conn: psycopg.Connection,
    make_role: Callable[[str], str],
    seeded: Seeded,
) -> None:
    discard_many(conn, 3, "outage-eu")
    discard_many(conn, 3, "billing-eu")
    read_only = Served(reader_dsn, read_only=True)  # as docs/operations.md sets one up
    try:
        page.goto(f"{read_only.url}jobs?queue=outage-eu")
        expect(page.locator("#results tbody tr")).to_have_count(3)
        expect(page.get_by_role("link", name="Retry all matching…")).to_have_count(0)
        page.goto(f"{read_only.url}jobs/bulk/retry?queue=outage-eu")
        expect(page.locator(".error-message")).to_contain_text("This dashboard is read-only")
    finally:
        read_only.stop()
        dashboard_of(read_only.app).close()

    # the read-only role behind a dashboard not told so: the database refuses, the page says why
    unaware = Served(reader_dsn)
    try:
        page.goto(f"{unaware.url}jobs?queue=outage-eu")
        page.get_by_role("link", name="Retry all matching…").click()
        page.get_by_role("button", name="Retry 3 jobs").click()
        expect(page.locator("#notice")).to_contain_text(
            "Stopped after 0 of 3 jobs (0 retried): the database refused the next batch: "
            "permission denied for function retry"
        )
        page.screenshot(path=str(ARTIFACTS / "dashboard-bulk-refused.png"), full_page=True)
        assert count_states(conn, "outage-eu") == {"discarded": 3}
    finally:
        unaware.stop()
        dashboard_of(unaware.app).close()

    tenant = make_role("tenant")
    conn.execute("SELECT treadle.grant_dashboard(%s)", (tenant,))
    conn.execute("SELECT treadle.set_tenant(%s, 'outage')", (tenant,))
    served = Served(as_role(dsn, tenant))
    try:
        page.goto(f"{served.url}jobs?state=discarded")
        expect(page.locator("#results tbody tr")).to_have_count(3)  # its own queues only
        page.get_by_role("link", name="Retry all matching…").click()
        expect(page.locator("h1")).to_have_text("Retry 3 jobs?")
        page.get_by_role("button", name="Retry 3 jobs").click()
        expect(page.locator("#notice")).to_contain_text("3 of 3 jobs retried in 1 batch.")
        assert count_states(conn, "outage-eu") == {"available": 3}
        assert count_states(conn, "billing-eu") == {"discarded": 3}
    finally:
        served.stop()
        dashboard_of(served.app).close()


def test_the_queue_page_shows_depth_throughput_failures_and_controls(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    discard_many(conn, 5, "outage")
    for _ in range(3):
        enqueue(conn, "sync_account", "outage")
    page.goto(served.url)
    page.locator("#queues").get_by_role("link", name="outage", exact=True).click()
    expect(page.locator("h1")).to_contain_text("outage")
    expect(page.locator("#throughput h2")).to_contain_text("0 completed, 5 discarded")
    expect(page.locator("#failures table.common-errors")).to_contain_text("ConnectionRefusedError: db down")
    expect(page.locator("#controls").get_by_role("button", name="Pause")).to_be_visible()
    expect(page.locator("#depth h2")).to_contain_text("waiting 3, running 0")
    enqueue(conn, "sync_account", "outage")
    expect(page.locator("#depth h2")).to_contain_text("waiting 4", timeout=30_000)  # a later sample, live
    expect(page.locator("#depth svg polyline.waiting")).to_have_count(1)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-queue.png"), full_page=True)


def test_pausing_a_queue_and_setting_its_limits_from_the_queue_page(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    settings = "SELECT paused, concurrency, rate_limit, rate_period::text, max_depth FROM treadle.queue_settings"
    page.goto(served.url + "/queues/mail")
    controls = page.locator("#controls")
    controls.get_by_role("button", name="Pause").click()
    expect(page.locator("#notice")).to_contain_text("Queue mail paused.")
    expect(controls.locator(".flag.paused")).to_have_text("paused")
    expect(controls.get_by_role("button", name="Resume")).to_be_visible()
    assert conn.execute(settings).fetchall() == [(True, None, None, None, None)]

    controls.get_by_label("Concurrency").fill("2")
    controls.get_by_label("Rate limit").fill("10")
    controls.get_by_label("per").fill("1s")
    controls.get_by_label("Max depth").fill("500")
    controls.get_by_role("button", name="Save limits").click()
    expect(page.locator("#notice")).to_contain_text("Queue mail: concurrency 2, rate 10/1s, max depth 500.")
    expect(controls.locator("dl.limits")).to_contain_text("10 per 1s")
    assert conn.execute(settings).fetchall() == [(True, 2, 10, "00:00:01", 500)]

    controls.get_by_label("Concurrency").fill("0")
    controls.get_by_role("button", name="Save limits").click()
    expect(page.locator("#notice")).to_contain_text("Did not apply:")
    assert conn.execute(settings).fetchall() == [(True, 2, 10, "00:00:01", 500)]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-queue-controls.png"), full_page=True)

    page.goto(served.url)
    expect(page.locator("#queues .flag.paused")).to_have_count(1)
    page.goto(served.url + f"/jobs/{seeded.available}")
    expect(page.locator("#reasons")).to_contain_text("paused")
    page.screenshot(path=str(ARTIFACTS / "dashboard-job-explain.png"), full_page=True)

    page.goto(served.url + "/queues/mail")
    controls.get_by_role("button", name="Resume").click()
    expect(page.locator("#notice")).to_contain_text("Queue mail resumed.")
    expect(controls.get_by_role("button", name="Pause")).to_be_visible()
    assert conn.execute(settings).fetchall() == [(False, 2, 10, "00:00:01", 500)]


def test_the_schedules_page(page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded) -> None:
    conn.execute("SELECT treadle.schedule('nightly', '30 2 * * *', 'build_report', tz => 'Europe/Paris')")
    page.goto(served.url)
    page.get_by_role("link", name="Schedules").click()
    row = page.locator("#schedules tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("td.next-local")).to_contain_text(" 02:30")
    expect(row).to_contain_text("Europe/Paris")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-schedules.png"), full_page=True)


def test_a_child_run_and_its_parent_link_to_each_other(page: Page, served: Served, conn: psycopg.Connection) -> None:
    conn.execute("SELECT treadle.define_workflow('charge', ARRAY['authorize'])")
    parent = conn.execute(
        "SELECT treadle.start_workflow('order', steps => ARRAY['pay', 'ship'], queue => 'shop',"
        ' children => \'{"pay": {"workflow": "charge"}}\')'
    ).fetchone()
    assert parent is not None
    (child,) = conn.execute("SELECT id FROM treadle.workflow_runs WHERE parent_run_id = %s", parent).fetchone() or (0,)
    page.goto(f"{served.url}runs/{parent[0]}")
    step = page.locator("table.steps tbody tr").first  # pay
    expect(step).to_contain_text("running")
    step.get_by_role("link", name=f"run #{child}").click()
    expect(page).to_have_url(re.compile(rf"/runs/{child}$"))
    expect(page.locator("h1")).to_contain_text("charge")
    page.locator("a.parent-run").click()
    expect(page).to_have_url(re.compile(rf"/runs/{parent[0]}$"))
    expect(page.locator("a.child-run", has_text=f"#{child}")).to_have_count(2)  # the step's row and Child runs


def test_the_run_page_retries_and_forks_a_run(
    page: Page, served: Served, conn: psycopg.Connection, seeded: Seeded
) -> None:
    run = seeded.failed_run
    page.goto(f"{served.url}runs/{run}")
    steps = page.locator("#run table.steps")
    expect(steps.locator("th")).to_contain_text(["Attempt", "Started", "Finished"])
    expect(steps.locator("tr", has_text="reserve").locator("td.finished")).not_to_have_text("—")
    expect(steps.locator("tr", has_text="charge")).to_contain_text("discarded")
    expect(steps.locator("td.attempt")).to_have_text(["1 / 1", "1 / 1", ""])  # ship has no job yet

    page.locator("#run .heading").get_by_role("button", name="Retry run").click()
    expect(page.locator("#notice")).to_contain_text(f"Workflow run {run} retried: it is running.")
    expect(page.locator("#run .heading")).to_contain_text("running")
    expect(page.locator("#run .heading").get_by_role("button", name="Retry run")).to_have_count(0)
    expect(page.locator("#run .heading").get_by_role("button", name="Cancel run")).to_be_visible()
    assert job_state(conn, seeded.failed_step) == "available"
    expect(steps.locator("tr", has_text="charge").locator("td.attempt")).to_have_text("0 / 1")  # retried afresh

    steps.locator("tr", has_text="charge").get_by_role("button", name="Fork from here").click()
    expect(page.locator("#notice")).to_contain_text(f"forked from run {run} at step charge")
    fork = page.locator("#run a.fork")
    expect(fork).to_have_count(1)
    fork.click()
    expect(page.locator("#run a.forked-from")).to_have_text(f"#{run}")
    expect(page.locator("#run table.steps tr", has_text="reserve")).to_contain_text('{"hold": "h-1"}')
    expect(page.locator("#run table.steps tr", has_text="charge")).to_contain_text("available")
    expect(page.locator("#run table.steps td.attempt")).to_have_text(["", "0 / 1", ""])  # reserve's result is kept
    page.screenshot(path=str(ARTIFACTS / "dashboard-forked-run.png"), full_page=True)


def test_the_run_page_draws_a_graph_and_its_wait_and_cancels_it(
    page: Page, served: Served, reader_dsn: str, conn: psycopg.Connection
) -> None:
    row_of_run = conn.execute(
        "SELECT treadle.start_workflow('gate', steps => ARRAY['check', 'score', 'approve', 'ship'], queue => 'gates',"
        ' after => \'{"ship": ["check", "score", "approve"]}\', waits => \'{"approve": {"signal": "approved"}}\')'
    ).fetchone()
    assert row_of_run is not None
    run = int(row_of_run[0])

    read_only = Served(reader_dsn, read_only=True)
    try:
        page.goto(f"{read_only.url}runs/{run}")
        expect(page.locator("#run table.steps tbody tr")).to_have_count(4)
        expect(page.locator("#run button")).to_have_count(0)  # no action on a read-only dashboard
    finally:
        read_only.stop()
        dashboard_of(read_only.app).close()

    page.goto(f"{served.url}runs/{run}")
    steps = page.locator("#run table.steps")
    expect(steps.locator("th")).to_contain_text(["Step", "State", "After"])
    rows = steps.locator("tbody tr")  # check, score, approve, ship
    expect(rows.locator("td.after")).to_have_text(["", "", "", "check, score, approve"])
    expect(rows.nth(2)).to_contain_text("for signal approved")
    expect(rows.nth(3)).to_contain_text("pending")
    expect(rows.locator("td.attempt")).to_have_text(["0 / 25", "0 / 25", "", ""])  # a wait step has no job

    page.locator("#run .heading").get_by_role("button", name="Cancel run").click()
    expect(page.locator("#notice")).to_contain_text(f"Workflow run {run} cancelled.")
    expect(page.locator("#run .heading")).to_contain_text("cancelled")
    expect(page.locator("#run .heading").get_by_role("button", name="Cancel run")).to_have_count(0)
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", (run,)).fetchone() == ("cancelled",)
    assert conn.execute(
        "SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = %s AND state <> 'cancelled'", (run,)
    ).fetchone() == (0,)


def test_the_run_page_draws_its_steps_and_their_dependencies(
    page: Page, served: Served, conn: psycopg.Connection
) -> None:
    """Above the steps table, a box per step in its state's class, in columns by depth and
    stacked in step order, an arrow per dependency, and a box that opens its step's job."""
    row_of_run = conn.execute(
        "SELECT treadle.start_workflow('publish', steps => ARRAY['fetch', 'parse', 'score', 'approve', 'post'],"
        ' queue => \'pubs\', waits => \'{"approve": {"signal": "approved"}}\','
        ' after => \'{"parse": ["fetch"], "score": ["fetch"], "approve": ["parse"],'
        ' "post": ["parse", "score", "approve"]}\')'
    ).fetchone()
    assert row_of_run is not None
    run = int(row_of_run[0])
    complete(conn, "pubs")  # fetch
    parse, _ = claim(conn, "pubs")  # parse runs; score stays available

    page.goto(f"{served.url}runs/{run}")
    drawing = page.locator("#run .run-graph svg")
    expect(drawing).to_be_visible()
    table = page.locator("#run table.steps").bounding_box()
    assert table is not None and (drawing.bounding_box() or {"y": table["y"]})["y"] < table["y"]

    nodes = drawing.locator("g.node")
    expect(nodes).to_have_count(5)
    for position, state in enumerate(["completed", "running", "available", "pending", "pending"], start=1):
        expect(nodes.nth(position - 1)).to_have_class(re.compile(rf"\bstate-{state}\b"))
        expect(nodes.nth(position - 1)).to_have_attribute("data-position", str(position))
    expect(nodes.nth(3)).to_have_class(re.compile(r"\bkind-signal\b"))
    expect(nodes.nth(1).locator("title")).to_have_text("parse: running, attempt 1 of 25")

    boxes = [nodes.nth(i).locator("rect.box").bounding_box() for i in range(5)]
    # centres: a box's bounds hold its stroke, thicker while it runs
    fetch, parsed, score, approve, post = [(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2) for b in boxes if b]
    assert fetch[0] < parsed[0] == score[0] < approve[0] < post[0]  # columns by depth
    assert fetch[1] == parsed[1] == approve[1] == post[1] < score[1]  # score stacks under parse

    edges = drawing.locator("path.edge")
    expect(edges).to_have_count(6)
    assert sorted(edges.evaluate_all("es => es.map(e => [e.dataset.from, e.dataset.to])")) == [
        ["1", "2"],
        ["1", "3"],
        ["2", "4"],
        ["2", "5"],
        ["3", "5"],
        ["4", "5"],
    ]
    assert edges.evaluate_all("es => es.every(e => e.getAttribute('marker-end') === 'url(#run-graph-arrow)')")

    expect(drawing.locator("a")).to_have_count(3)  # approve and post have no job yet
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-run-graph.png"), full_page=True)
    drawing.locator("a", has=page.locator('g.node[data-position="2"]')).click()
    expect(page).to_have_url(re.compile(rf"/jobs/{parse}$"))
    expect(page.locator("#job h1")).to_contain_text("workflow:publish/parse")


def test_a_long_run_scrolls_in_its_box_and_keeps_its_place_across_refreshes(
    page: Page, served: Served, conn: psycopg.Connection
) -> None:
    """A list of 200 steps is a row wider than the page: its box scrolls, the page does not
    widen, and a live refresh leaves the box where the reader scrolled it."""
    steps = [f"step_{i:03}" for i in range(200)]
    row_of_run = conn.execute(
        "SELECT treadle.start_workflow('long', steps => %s, queue => 'long')", (steps,)
    ).fetchone()
    assert row_of_run is not None
    page.goto(f"{served.url}runs/{row_of_run[0]}")
    box = page.locator("#run .run-graph")
    expect(box.locator("g.node")).to_have_count(200)
    assert box.evaluate("b => b.scrollWidth > 20 * b.clientWidth")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    box.evaluate("b => { b.scrollLeft = 12000; }")
    shown = page.locator("#updated").inner_text()
    expect(page.locator("#updated")).not_to_have_text(shown)  # a refresh replaced the section
    expect(page.locator("#run .run-graph g.node")).to_have_count(200)
    assert page.locator("#run .run-graph").evaluate("b => b.scrollLeft") == 12000
