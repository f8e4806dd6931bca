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
