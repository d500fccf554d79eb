"""Start-up and requests never touch the internet (DESIGN.md, Offline).

The real `context-gateway serve` runs as a child process with no config file, its
upstream pointed at a local fake, and every non-loopback connection failing fast: in
a fresh network namespace (only loopback exists) when the machine allows one, and
always with a socket guard that records any attempt (DNS lookups included).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.netguard.probe import namespace_prefix

ROOT = Path(__file__).resolve().parents[2]


def test_server_starts_and_serves_with_no_network(tmp_path: Path) -> None:
    log = tmp_path / "blocked.log"
    command = [*namespace_prefix(), sys.executable, "-m", "tests.integration.netguard.probe", str(log)]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    assert result["blocked_attempts"] == [], result["server_output"]
    assert result["healthz"] == 200, result["server_output"]
    assert result["metrics"] == 200
    assert result["chat"] == [200, 200, 200]
    assert "Traceback" not in result["server_output"]
