"""Fixtures of the reliability suite: one Trireme server for the module, and the session's summary line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.servers import build_repo, start, stop
from tests.reliability.tally import FULL, Tally, Target

SUMMARY = pytest.StashKey[Tally]()


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probes' model repository."""
    return build_repo(tmp_path_factory.mktemp("reliability") / "repo")


@pytest.fixture(scope="module")
def target(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A Trireme server on the probes' repository."""
    server = start("trireme", repo, tmp_path_factory.mktemp("srv") / "server.log")
    yield server
    stop(server)


@pytest.fixture
def summary(request: pytest.FixtureRequest) -> Tally:
    """The session's running totals (printed as one line at the end)."""
    return request.config.stash.setdefault(SUMMARY, Tally())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The one summary line of the reliability suite."""
    tally = config.stash.get(SUMMARY, None)
    if tally is not None and tally.cases:
        label = f"reliability (trireme, {'full' if FULL else 'short'})"
        terminalreporter.write_line(tally.line(label))
