"""Serve an ASGI app on a real socket from a background thread.

Tests, benchmarks and fault injection need real TCP (keep-alive, chunked
bodies, dropped connections), so both the fake upstream and the gateway under
test run in a genuine uvicorn server rather than an in-process transport.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.types import ASGIApp

STARTUP_TIMEOUT = 10.0
# A request the fake deliberately hangs must not hold up teardown for its full
# hang time: after this many seconds uvicorn cancels what is still running.
GRACEFUL_SHUTDOWN_SECONDS = 2


def _bound_socket(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (for "connection refused" tests)."""
    with _bound_socket(host) as sock:
        port: int = sock.getsockname()[1]
    return port


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextmanager
def serve_in_thread(
    app: ASGIApp, host: str = "127.0.0.1", *, loop: str = "asyncio", **options: Any
) -> Iterator[str]:
    """Run `app` under uvicorn in a daemon thread; yield its base URL ("http://127.0.0.1:PORT").

    ``options`` are further uvicorn settings (the gateway's come from `gateway.server.run.server_options`).

    The socket is bound here, before the thread starts, so the port is known
    without a race and no other process can take it in between.
    """
    sock = _bound_socket(host)
    port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        loop=loop,
        lifespan="on",
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        **{"http": "httptools", **options},
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"uvicorn:{port}"
    )
    thread.start()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"server on port {port} died during start-up (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {port} did not start within {STARTUP_TIMEOUT}s")
            time.sleep(0.005)
        yield _url(host, port)
    finally:
        server.should_exit = True
        thread.join(GRACEFUL_SHUTDOWN_SECONDS + 5)
        sock.close()
