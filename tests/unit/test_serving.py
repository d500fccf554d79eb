"""Worker counts: a number, or one per CPU the process may use (a container's CPU limit included)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.server.cpus import usable_cpus, worker_count

AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000\n", AFFINITY),  # no CPU limit: every CPU of the affinity mask
        ("50000 100000\n", 1),  # half a CPU still needs one worker
        ("150000 100000\n", min(AFFINITY, 2)),  # 1.5 CPUs round up
        ("100000000 100000\n", AFFINITY),  # a limit above the mask does not add CPUs
        ("garbage", AFFINITY),
    ],
)
def test_usable_cpus_follow_a_cgroup_cpu_limit(tmp_path: Path, cpu_max: str, expected: int) -> None:
    limit = tmp_path / "cpu.max"
    limit.write_text(cpu_max)
    assert usable_cpus(limit, tmp_path / "no-v1") == expected


@pytest.mark.parametrize(
    ("quota", "period", "expected"),
    [("-1", "100000", AFFINITY), ("50000", "100000", 1), ("100000", "100000", 1), ("garbage", "1", AFFINITY)],
)
def test_usable_cpus_follow_a_cgroup_v1_cpu_quota(
    tmp_path: Path, quota: str, period: str, expected: int
) -> None:
    """Nodes still on cgroup v1 state a CPU limit as a CFS quota: without it, `auto` started a
    worker per node CPU in a pod limited to one."""
    (tmp_path / "cpu.cfs_quota_us").write_text(quota + "\n")
    (tmp_path / "cpu.cfs_period_us").write_text(period + "\n")
    assert usable_cpus(tmp_path / "absent", tmp_path) == expected


def test_usable_cpus_without_cgroup_file(tmp_path: Path) -> None:
    assert usable_cpus(tmp_path / "absent", tmp_path / "absent-v1") == AFFINITY


def test_worker_count() -> None:
    assert worker_count("3") == 3
    assert worker_count("1") == 1
    assert worker_count("auto") == worker_count("0") == usable_cpus() >= 1
