"""The markers follow from the fixtures a test uses, and an unmarked test cannot start a process."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.markers import UnmarkedProcess, marks_users


@pytest.fixture
@marks_users(pytest.mark.subprocess)
def child() -> Iterator[subprocess.Popen[bytes]]:
    with subprocess.Popen([sys.executable, "-c", "pass"]) as process:
        yield process


@pytest.fixture
def uses_child(child: subprocess.Popen[bytes]) -> int:
    return child.wait(30)


def test_an_unmarked_test_may_not_start_a_process(tmp_path: os.PathLike[str]) -> None:
    witness = os.path.join(tmp_path, "ran")
    with pytest.raises(UnmarkedProcess, match=r"test_markers\.py::test_an_unmarked.* is not marked subprocess"):
        subprocess.run([sys.executable, "-c", f"open({witness!r}, 'w').close()"], check=False)
    with pytest.raises(UnmarkedProcess):
        os.fork()
    with pytest.raises(UnmarkedProcess):
        pty.fork()
    assert not os.path.exists(witness), "the process was refused before it started"


@pytest.mark.subprocess
def test_a_marked_test_may() -> None:
    assert subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True).stdout == "ran\n"


def test_a_fixture_that_starts_a_process_marks_its_users(request: pytest.FixtureRequest, uses_child: int) -> None:
    """Through another fixture too; the child started in this (otherwise unmarked) test's setup."""
    assert uses_child == 0
    assert request.node.get_closest_marker("subprocess") is not None


def test_a_test_that_uses_no_such_fixture_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("subprocess") is None
    assert request.node.get_closest_marker("browser") is None
