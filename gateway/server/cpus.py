"""How many worker processes "auto" means: the CPUs this process may use."""

from __future__ import annotations

import math
import os
from pathlib import Path

# cgroup v2: "<quota> <period>" in microseconds, or "max <period>" without a CPU limit.
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
# cgroup v1 (older nodes): cpu.cfs_quota_us (-1 without a limit) over cpu.cfs_period_us.
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")


def usable_cpus(cpu_max: Path = CGROUP_CPU_MAX, cgroup_v1: Path = CGROUP_V1_CPU) -> int:
    """CPUs this process may run on (its affinity mask), capped by a container's CPU limit."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    limit = _cpu_limit(cpu_max, cgroup_v1)
    return cpus if limit is None else min(cpus, max(1, math.ceil(limit)))


def _cpu_limit(cpu_max: Path, cgroup_v1: Path) -> float | None:
    """The container's CPU limit in CPUs, None without one (or without a cgroup CPU controller)."""
    try:
        quota, period = cpu_max.read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass  # no cgroup v2 CPU controller here
    try:
        v1_quota = int((cgroup_v1 / "cpu.cfs_quota_us").read_text())
        v1_period = int((cgroup_v1 / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return v1_quota / v1_period if v1_quota > 0 and v1_period > 0 else None


def worker_count(setting: str) -> int:
    """``server.workers`` as a number of processes (validated by the settings already)."""
    return usable_cpus() if setting in ("auto", "0") else int(setting)
