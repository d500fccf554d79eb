"""Pytest fixtures for the fake upstream (load with `pytest_plugins = ["tests.fakes.fixtures"]`).

One server per test session (start-up costs ~tens of ms and a thread); each
test gets it back in its default state.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.serve import serve_in_thread
from tests.fakes.upstream import FakeUpstream, create_app


@pytest.fixture(scope="session")
def fake_upstream_server() -> Iterator[FakeUpstream]:
    """The session's served fake, in whatever state the last test left it; prefer `fake_upstream`."""
    fake = FakeUpstream()
    with serve_in_thread(create_app(fake)) as url:
        fake.base_url = f"{url}/v1"
        yield fake


@pytest.fixture
def fake_upstream(fake_upstream_server: FakeUpstream) -> FakeUpstream:
    """The served fake, reset: `.base_url` is "http://127.0.0.1:PORT/v1"; set knobs, read `.received`."""
    fake_upstream_server.reset()
    return fake_upstream_server
