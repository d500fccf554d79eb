"""Start the real `context-gateway serve` with no config and the network guard, then probe it.

Run by test_offline.py, inside a fresh network namespace when the machine allows one (so any
non-loopback connection fails at the kernel too). Prints one JSON object with what it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.fakes.serve import free_port

GUARD_DIR = Path(__file__).parent


def main() -> None:
    log = Path(sys.argv[1])
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(GUARD_DIR), os.environ.get("PYTHONPATH", "")]),
        "NETGUARD_LOG": str(log),
    }
    for name in ("TIKTOKEN_CACHE_DIR", "LITELLM_LOCAL_MODEL_COST_MAP", "GATEWAY_CONFIG"):
        env.pop(name, None)
    started = time.monotonic()
    server = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    result: dict[str, object] = {}
    try:
        ready_after = None
        while time.monotonic() - started < 60:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
                    result["healthz"] = answer.status
                    ready_after = time.monotonic() - started
                    break
            except OSError:
                if server.poll() is not None:
                    break
                time.sleep(0.05)
        result["ready_seconds"] = ready_after
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            result["metrics"] = answer.status
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    result["server_output"] = output.decode(errors="replace")[-4000:]
    result["blocked_attempts"] = log.read_text().splitlines() if log.exists() else []
    print(json.dumps(result))


if __name__ == "__main__":
    main()
