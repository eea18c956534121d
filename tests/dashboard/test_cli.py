"""`treadle dashboard` (run_cli): what it refuses, and a real server it runs and stops."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from treadle.dashboard import run_cli

SERVE = "import sys; from treadle.dashboard import run_cli; sys.exit(run_cli(sys.argv[1:]))"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "give --dsn or set DATABASE_URL"),
        (["--dsn", "postgresql://x/y", "--host", "0.0.0.0"], {}, "refusing to serve 0.0.0.0 without authentication"),
        (
            ["--dsn", "postgresql://x/y", "--basic-auth", "admin"],
            {},
            "--basic-auth needs a user name, and the password",
        ),
        (["--dsn", "postgresql://x/y", "--prefix", "admin"], {}, "--prefix must be a path such as /admin/jobs"),
        (["--dsn", "postgresql://x/y", "--port", "70000"], {}, "--port must be between 0 and 65535"),
        (["--dsn", "postgresql://x/y", "--refresh", "0"], {}, "refresh_seconds must be between 1 and 3600"),
    ],
)
def test_run_cli_refuses_what_it_cannot_serve_safely(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("TREADLE_DASHBOARD_PASSWORD", raising=False)
    assert run_cli(args) == 2
    assert message in capsys.readouterr().err


def test_run_cli_help_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--help"]) == 0
    assert "--basic-auth USER" in capsys.readouterr().out
    assert run_cli(["--port", "many"]) == 2
    assert "invalid int value" in capsys.readouterr().err


@contextmanager
def serving(args: list[str], env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("treadle dashboard: http://"), (line, process.stderr.read() if process.stderr else "")
        yield process, line.split(": ", 1)[1].strip()
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()  # waits, and closes both pipes


def get(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)


@pytest.mark.subprocess
def test_stops_while_a_browser_keeps_its_connection_open(operator_dsn: str) -> None:
    with serving(["--dsn", operator_dsn, "--port", "0"]) as (process, url):
        host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
        with socket.create_connection((host, int(port)), timeout=30) as browser:
            browser.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: keep-alive\r\n\r\n".encode())
            assert browser.recv(4096).startswith(b"HTTP/1.1 200")  # answered, and the connection stays open
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=30)
        assert process.returncode == 0


@pytest.mark.subprocess
def test_serves_on_loopback_under_a_prefix_and_stops_on_sigterm(operator_dsn: str) -> None:
    with serving(["--dsn", operator_dsn, "--port", "0", "--prefix", "/admin/jobs"]) as (process, url):
        assert url.startswith("http://127.0.0.1:") and url.endswith("/admin/jobs/")
        assert get(url) == 200
        assert get(url + "health") == 200
        assert get(url.replace("/admin/jobs/", "/")) == 404
        assert get(url, {"Host": "rebound.example"}) == 400  # only loopback names, without auth
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)  # reads stderr while it waits: a full pipe would block the exit
        assert process.returncode == 0
        assert "no authentication, so serving 127.0.0.1 only" in err


@pytest.mark.subprocess
def test_serves_with_basic_auth(reader_dsn: str) -> None:
    env = {"TREADLE_DASHBOARD_PASSWORD": "s3cret"}
    with serving(["--dsn", reader_dsn, "--port", "0", "--basic-auth", "admin", "--read-only"], env) as (process, url):
        assert get(url) == 401
        token = base64.b64encode(b"admin:s3cret").decode()
        assert get(url, {"Authorization": f"Basic {token}"}) == 200
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)  # reads stderr while it waits: a full pipe would block the exit
        assert process.returncode == 0
        assert "no authentication" not in err


@pytest.mark.subprocess
def test_a_busy_port_is_an_error(operator_dsn: str) -> None:
    with serving(["--dsn", operator_dsn, "--port", "0"]) as (process, url):
        port = url.rsplit(":", 1)[1].strip("/")
        second = subprocess.run(
            [sys.executable, "-c", SERVE, "--dsn", operator_dsn, "--port", port],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in second.stderr
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        assert process.returncode == 0
