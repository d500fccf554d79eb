"""Serving the gateway: uvicorn with the connection limits, under the process's file limit, as one
process or several workers on one socket, with a graceful drain.

With ``server.workers`` above 1 uvicorn's supervisor binds the socket once and starts that many
worker processes (each builds its own app from the same settings, passed down through the
environment; a worker that dies is replaced). Learned windows and calibration are shared
through Redis when ``redis_url`` is set; with the in-memory store each worker keeps its own.
Every worker writes its metrics to files in ``PROMETHEUS_MULTIPROC_DIR`` (a fresh temporary
directory unless the operator names one, which is emptied first: stale files from an earlier
run would add to the new counts), and a scrape of any worker reports them all.

On SIGTERM (or SIGINT) uvicorn closes the listening socket at once — new connections, probes
included, are refused, so the pod is no longer ready — closes idle keep-alive connections,
lets requests and streams in flight finish for up to ``server.shutdown_grace_seconds``, then
cuts what remains and exits.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.supervisors import Multiprocess

from gateway.metrics import MULTIPROC_DIR_ENV, process_gone
from gateway.request_log import RequestLines, logging_config
from gateway.server.cpus import worker_count
from gateway.server.protocol import ConnectionLimits, limited_protocol
from gateway.settings import CONFIG_ENV, ServerSettings, Settings, load_settings

log = logging.getLogger("gateway")

# Descriptors kept for everything but client and upstream sockets: listening socket, Redis,
# log files, the tokenizer cache, the event loop's own.
RESERVED_FDS = 64


def serve(settings: Settings, config_path: str | None) -> None:
    from gateway.app import create_app

    server = settings.server
    workers = worker_count(server.workers)
    options: dict[str, Any] = {
        "host": server.host,
        "port": server.port,
        "loop": "uvloop",
        "access_log": False,
        "log_config": logging_config(server.log_format, server.log_level),
        "log_level": server.log_level,
        "timeout_graceful_shutdown": math.ceil(server.shutdown_grace_seconds),
    }
    open_file_limit = raise_open_file_limit()  # inherited by the workers
    if workers == 1:
        config = uvicorn.Config(create_app(settings), **options, **server_options(server, open_file_limit))
        with _metrics_directory(create=False):
            uvicorn.Server(config).run()
        return
    # Workers start from scratch and read their settings where the supervisor read them.
    if config_path:
        os.environ[CONFIG_ENV] = str(Path(config_path).resolve())
    os.environ["GATEWAY_SERVER_HOST"] = server.host
    os.environ["GATEWAY_SERVER_PORT"] = str(server.port)
    config = _WorkerConfig(f"{__name__}:worker_app", factory=True, workers=workers, **options)
    with _metrics_directory(create=True):
        _Supervisor(config, sockets=[config.bind_socket()]).run()


class _WorkerConfig(uvicorn.Config):
    """Sent to each worker process (pickled): the limited protocol class is built there, from the
    same settings, since a class made at run time cannot travel."""

    def load(self) -> None:
        options = server_options(load_settings().server, raise_open_file_limit())
        self.http = options["http"]
        self.ws = options["ws"]
        self.timeout_keep_alive = options["timeout_keep_alive"]
        super().load()


class _Supervisor(Multiprocess):
    """uvicorn's worker supervisor, except that it stops listening as soon as it is told to stop:
    its own copy of the socket would keep taking connections into a backlog no worker serves;
    and a worker that died without exiting (killed outright: out of memory) has its live gauges
    retired when it is replaced, which it could not do itself."""

    def keep_subprocess_alive(self) -> None:
        alive = {process.pid for process in self.processes}
        super().keep_subprocess_alive()
        for pid in alive - {process.pid for process in self.processes}:
            if pid is not None:
                process_gone(pid)

    def handle_term(self) -> None:
        self._stop_listening()
        super().handle_term()

    def handle_int(self) -> None:
        self._stop_listening()
        super().handle_int()

    def _stop_listening(self) -> None:
        for sock in self.sockets:
            sock.close()


def worker_app() -> Starlette:
    """The app of one worker process (uvicorn calls this in each)."""
    from gateway.app import create_app

    return create_app(load_settings())


@contextmanager
def _metrics_directory(*, create: bool) -> Iterator[None]:
    """Empty the operator's metrics directory; with several workers and none named, use a
    temporary one for this run."""
    named = os.environ.get(MULTIPROC_DIR_ENV)
    if named:
        directory = Path(named)
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink()
        yield
        return
    if not create:
        yield
        return
    temporary = tempfile.mkdtemp(prefix="context-gateway-metrics-")
    os.environ[MULTIPROC_DIR_ENV] = temporary
    try:
        yield
    finally:
        del os.environ[MULTIPROC_DIR_ENV]
        shutil.rmtree(temporary, ignore_errors=True)


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
        body_min_rate=server.body_min_rate,
    )
    return {
        "http": limited_protocol(limits, RequestLines(server.log_format)),
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
