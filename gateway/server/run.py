"""Serving the gateway: uvicorn with the connection limits, under the process's file limit."""

from __future__ import annotations

import logging
import resource
from typing import Any

import uvicorn

from gateway.server.protocol import ConnectionLimits, limited_protocol
from gateway.settings import ServerSettings, Settings

log = logging.getLogger("gateway")

# Descriptors kept for everything but client and upstream sockets: listening socket, Redis,
# log files, the tokenizer cache, the event loop's own.
RESERVED_FDS = 64


def serve(settings: Settings, *, host: str, port: int) -> None:
    from gateway.app import create_app

    options = server_options(settings.server, raise_open_file_limit())
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        loop="uvloop",
        access_log=False,
        log_level=settings.server.log_level,
        timeout_graceful_shutdown=30,
        **options,
    )


def server_options(server: ServerSettings, open_file_limit: int | None = None) -> dict[str, Any]:
    """uvicorn keyword arguments that apply ``server.*`` limits (tests serve with these too)."""
    cap = server.max_connections
    if open_file_limit is not None:
        cap = connection_cap(server.max_connections, open_file_limit)
        if cap < server.max_connections:
            log.warning(
                "server.max_connections lowered from %d to %d: the process may open %d files, and each "
                "client connection may need an upstream one beside it",
                server.max_connections,
                cap,
                open_file_limit,
            )
    limits = ConnectionLimits(
        max_connections=cap,
        max_header_bytes=server.max_header_bytes,
        header_timeout=server.header_timeout,
        body_timeout=server.body_timeout,
    )
    return {
        "http": limited_protocol(limits),
        "ws": "none",
        "timeout_keep_alive": server.keep_alive_timeout,
    }


def connection_cap(configured: int, open_file_limit: int) -> int:
    """Client connections that fit under the file limit: each may hold one upstream connection
    (the pool never has more connections than requests in flight), plus the reserve."""
    return max(1, min(configured, (open_file_limit - RESERVED_FDS) // 2))


def raise_open_file_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard one (unprivileged processes may); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY:
        # No finite hard limit to raise to; stay at the soft one if it is finite.
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft
