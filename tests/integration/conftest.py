"""Fixtures the integration tests share (the server fixtures themselves are in tests/conftest.py).

A test module names its running server fixture `server`; `client` is then a tritonclient gRPC client of it,
closed after the test. Model sources the tests share are in tests/integration/models.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    """A gRPC client of the module's `server`."""
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()
