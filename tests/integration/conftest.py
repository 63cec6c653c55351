"""Fixtures the integration tests share (the server fixtures themselves are in tests/conftest.py).

A test module names its running server fixture `server`; `client` is then a tritonclient gRPC client of it,
closed after the test. Model sources the tests share are in tests/integration/models.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import EXAMPLE_REPO, ServerProcess, running_server


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    """A gRPC client of the module's `server`."""
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


@pytest.fixture(scope="module", params=["grpcio", "h2"])
def transport_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server on the example repository per gRPC transport (grpcio, h2), its name in `.transport`: for the tests
    of HTTP/2 on the wire, which both must answer alike."""
    log: Path = tmp_path_factory.mktemp("srv") / "server.log"
    with running_server([EXAMPLE_REPO], log, ["--grpc-transport", request.param]) as s:
        s.transport = request.param  # type: ignore[attr-defined]
        yield s
