"""How many worker processes "auto" means: the CPUs this process may use."""

from __future__ import annotations

import math
import os
from pathlib import Path

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
