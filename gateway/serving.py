"""Running the gateway: one process or several workers on one socket, with a graceful drain.

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

import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from uvicorn.supervisors import Multiprocess

from gateway.app import create_app
from gateway.metrics import MULTIPROC_DIR_ENV
from gateway.request_log import logging_config
from gateway.settings import CONFIG_ENV, Settings, load_settings

# cgroup v2: "<quota> <period>" in microseconds, or "max <period>" without a CPU limit.
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """CPUs this process may run on (its affinity mask), capped by a container's CPU limit."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 CPU controller here: the affinity mask stands
    return cpus


def worker_count(setting: str) -> int:
    """``server.workers`` as a number of processes (validated by the settings already)."""
    return usable_cpus() if setting in ("auto", "0") else int(setting)


def serve(settings: Settings, config_path: str | None) -> None:
    server = settings.server
    workers = worker_count(server.workers)
    if workers > 1:
        # Workers start from scratch and read their settings where the supervisor read them.
        if config_path:
            os.environ[CONFIG_ENV] = str(Path(config_path).resolve())
        os.environ["GATEWAY_SERVER_HOST"] = server.host
        os.environ["GATEWAY_SERVER_PORT"] = str(server.port)
    config = uvicorn.Config(
        f"{__name__}:worker_app" if workers > 1 else create_app(settings),
        factory=workers > 1,
        workers=workers,
        host=server.host,
        port=server.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_config=logging_config(server.log_format, server.log_level),
        log_level=server.log_level,
        timeout_graceful_shutdown=math.ceil(server.shutdown_grace_seconds),
    )
    with _metrics_directory(create=workers > 1):
        if workers == 1:
            uvicorn.Server(config).run()
        else:
            _Supervisor(config, sockets=[config.bind_socket()]).run()


class _Supervisor(Multiprocess):
    """uvicorn's worker supervisor, except that it stops listening as soon as it is told to stop:
    its own copy of the socket would keep taking connections into a backlog no worker serves."""

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
