"""Start-up and requests never touch the internet (DESIGN.md, Offline).

The real `context-gateway serve` runs as a child process with no config file, its
upstream pointed at a local fake, and every non-loopback connection failing fast: in
a fresh network namespace (only loopback exists) when the machine allows one, and
always with a socket guard that records any attempt (DNS lookups included).
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.netguard.probe import assert_serves_offline


def test_server_starts_and_serves_with_no_network(tmp_path: Path) -> None:
    assert_serves_offline(tmp_path, [])
