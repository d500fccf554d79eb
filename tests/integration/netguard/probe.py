"""Start the real `context-gateway serve` with no config and the network guard, then probe it.

Run by test_offline.py, inside a fresh network namespace when the machine allows one (so any
non-loopback connection fails at the kernel too). Prints one JSON object with what it saw.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.fakes.serve import free_port, serve_in_thread
from tests.fakes.upstream import FakeUpstream, create_app

GUARD_DIR = Path(__file__).parent


def namespace_prefix() -> list[str]:
    """`unshare -n` with loopback up, when this machine lets us make a network namespace."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return []
    trial = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    if trial.returncode != 0:
        return []
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "netns"]


def assert_serves_offline(workdir: Path, gateway_command: list[str]) -> None:
    """Run this probe in a child (in a network namespace when possible) against ``gateway_command``
    (empty: this interpreter's ``-m gateway.cli``) and check it started and served with no network."""
    log = workdir / "blocked.log"
    probe_command = [*namespace_prefix(), sys.executable, "-m", __spec__.name, str(log), *gateway_command]
    repo = Path(__file__).resolve().parents[3]
    finished = subprocess.run(
        probe_command, cwd=repo, capture_output=True, text=True, timeout=180, check=False
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    assert result["blocked_attempts"] == [], result["server_output"]
    assert result["healthz"] == 200, result["server_output"]
    assert result["readyz"] == 200 and result["metrics"] == 200
    assert result["chat"] == [200, 200, 200]
    assert "Traceback" not in result["server_output"]


def main() -> None:
    """Arguments: the log of blocked attempts, then optionally the gateway command to run
    (default: this interpreter's ``-m gateway.cli``)."""
    command = sys.argv[2:] or [sys.executable, "-m", "gateway.cli"]
    with serve_in_thread(create_app(FakeUpstream())) as upstream_url:
        print(json.dumps(probe(Path(sys.argv[1]), upstream_url, command)))


def _chat(port: int, model: str) -> int:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        status: int = answer.status
        return status


def probe(log: Path, upstream_url: str, command: list[str]) -> dict[str, object]:
    port = free_port()
    env = {
        **os.environ,
        # No config file: only the upstream is pointed at the local fake.
        "GATEWAY_UPSTREAM_BASE_URL": f"{upstream_url}/v1",
        "PYTHONPATH": os.pathsep.join([str(GUARD_DIR), os.environ.get("PYTHONPATH", "")]),
        "NETGUARD_LOG": str(log),
    }
    for name in ("TIKTOKEN_CACHE_DIR", "LITELLM_LOCAL_MODEL_COST_MAP", "GATEWAY_CONFIG"):
        env.pop(name, None)
    started = time.monotonic()
    server = subprocess.Popen(
        [*command, "serve", "--port", str(port)],
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
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            result["readyz"] = answer.status
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            result["metrics"] = answer.status
        # Exact (tiktoken, model map) and approximated (unknown family) counting paths.
        result["chat"] = [
            _chat(port, "gpt-4o"),
            _chat(port, "claude-sonnet-4-5"),
            _chat(port, "my-local-llm"),
        ]
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    result["server_output"] = output.decode(errors="replace")[-4000:]
    result["blocked_attempts"] = log.read_text().splitlines() if log.exists() else []
    return result


if __name__ == "__main__":
    main()
