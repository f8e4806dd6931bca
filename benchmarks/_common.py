"""Helpers shared by the benchmark scripts (run as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable


def logger(name: str) -> Callable[[str], None]:
    """A ``log(msg)`` that prints ``[name] msg`` to stderr (stdout carries the JSON)."""

    def log(msg: str) -> None:
        print(f"[{name}] {msg}", file=sys.stderr, flush=True)

    return log


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loadavg() -> float | None:
    """The 1-minute load average (other work on the cores skews every timing)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine(load_before: float | None) -> dict[str, object]:
    """What a benchmark's JSON says of the machine: CPU, cores, torch and its threads, and the
    load average before (``load_before``) and after the runs."""
    import torch

    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "loadavg_1min_before_after": [load_before, loadavg()],
    }
