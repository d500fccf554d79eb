"""Shared fixtures: the fake upstream (tests/fakes), a real Redis, the gateway under test."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

import gateway  # noqa: F401  (offline tiktoken before anything loads it)
from gateway.app import create_app
from gateway.chat_request import PARSERS
from gateway.server.run import server_options
from gateway.settings import load_settings
from gateway.tokens.counter import CALIBRATION, CONVERSATIONS, MESSAGE_COUNTS
from tests.fakes.serve import serve_in_thread
from tests.fakes.upstream import FakeUpstream

pytest_plugins = ["tests.fakes.fixtures"]

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379

GatewayFactory = Callable[..., str]


@pytest.fixture(autouse=True)
def isolated_process_state() -> Iterator[None]:
    """Calibration factors, cached counts and the gateway's log configuration are process-wide: no
    test sees another's (a CLI test configures logging as `context-gateway` does at start; left so,
    the request lines of later tests' gateways would land on the run's own output)."""
    CALIBRATION.clear()
    MESSAGE_COUNTS.clear()
    CONVERSATIONS.clear()
    PARSERS.clear()
    logger = logging.getLogger("gateway")
    level, handlers, propagate = logger.level, list(logger.handlers), logger.propagate
    yield
    CALIBRATION.clear()
    MESSAGE_COUNTS.clear()
    CONVERSATIONS.clear()
    PARSERS.clear()
    logger.setLevel(level)
    logger.handlers[:] = handlers
    logger.propagate = propagate


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A real Redis on 127.0.0.1:6379 (database 15, or $TEST_REDIS_DB so that parallel runs keep
    apart): skipped without one, except under CI=true."""
    try:
        with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=1):
            pass
    except OSError as exc:
        reason = f"no Redis server at {REDIS_HOST}:{REDIS_PORT} ({exc.strerror or exc})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI must run the Redis tests")
        pytest.skip(reason)
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{int(os.environ.get('TEST_REDIS_DB', '15'))}"


@pytest.fixture
def start_gateway(fake_upstream: FakeUpstream) -> Iterator[GatewayFactory]:
    """Start a real gateway (uvicorn on a free port) in front of the fake upstream.

    Keyword arguments are environment-style overrides, e.g.
    ``start_gateway(GATEWAY_UPSTREAM_API_KEY="sk-x")``; returns the gateway's ``/v1`` base URL.
    """
    with ExitStack() as stack:

        def start(**environ: str) -> str:
            upstreams = {
                "GATEWAY_UPSTREAM_BASE_URL": fake_upstream.base_url,
                "GATEWAY_UPSTREAM_ANTHROPIC_BASE_URL": fake_upstream.base_url.removesuffix("/v1"),
            }
            settings = load_settings(None, {**upstreams, **environ})
            app = create_app(settings)
            url = stack.enter_context(serve_in_thread(app, **server_options(settings.server)))
            return f"{url}/v1"

        yield start


@pytest.fixture
def gateway_url(start_gateway: GatewayFactory) -> str:
    """A gateway with default settings in front of the fake upstream."""
    return start_gateway()
