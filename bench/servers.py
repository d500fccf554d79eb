"""Benchmark servers as subprocesses: started one at a time, health-checked, always stopped."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 60.0


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    origin: str
    log: Path
    ready_seconds: float = 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def bench_environment() -> dict[str, str]:
    """This environment without GATEWAY_* settings, so each bench configures its gateways itself."""
    return {key: value for key, value in os.environ.items() if not key.startswith("GATEWAY_")}


def gateway_environment(upstream: Server) -> dict[str, str]:
    """`bench_environment()` for a gateway in front of `upstream` (for every API it serves),
    logging warnings only."""
    return {
        **bench_environment(),
        "GATEWAY_UPSTREAM_BASE_URL": upstream.origin + "/v1",
        "GATEWAY_UPSTREAM_ANTHROPIC_BASE_URL": upstream.origin,
        "GATEWAY_SERVER_LOG_LEVEL": "warning",
    }


def _die_with_parent() -> None:
    # Runs in the child before exec: if the bench is killed outright (SIGKILL), its
    # servers get SIGTERM from the kernel instead of lingering on their ports.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def start(
    name: str, argv: Sequence[str], *, health: str, env: dict[str, str], logs: Path, cwd: Path = REPO
) -> Server:
    """Spawn `python ARGV --port P` in `cwd` (another checkout: its own code runs) and wait until
    `health` answers 200 (time-to-ready: spawn → 200)."""
    port = free_port()
    log = logs / f"{name.replace(' ', '-')}.log"
    started = time.perf_counter()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, *argv, "--port", str(port)],
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C reaches the bench only, which then stops every server itself.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    server = Server(name, process, f"http://127.0.0.1:{port}", log)
    deadline = started + READY_TIMEOUT
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(server.origin + health, timeout=1) as reply:
                if reply.status == 200:
                    server.ready_seconds = time.perf_counter() - started
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.01)
    stop(server)
    raise RuntimeError(f"{name} not ready after {READY_TIMEOUT:g} s:\n{log.read_text()[-2000:]}")


def stop(server: Server) -> None:
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=5)
