"""Start-up time of the ``asymvlm`` command line: ``--help``, ``--version`` and sub-commands'
``--help``, each a fresh ``python -m asymvlm.cli`` process timed from launch to exit.

With ``--baseline REF`` the same commands also run on the ``asymvlm`` package of that git
commit (exported to a temporary folder, first on ``PYTHONPATH``, same interpreter and
libraries), interleaved with this checkout's (A, B, A, B, ...): ``ratio`` is this checkout's
median over the baseline's. ``heavy_imports`` lists which of torch, ray, mlflow, pyarrow,
pandas and scipy the command imported (``python -X importtime``), ``import_seconds`` the
cumulative import time of everything it imported. One JSON object goes to stdout::

    .venv/bin/python benchmarks/cli_startup.py [--baseline 0236d90] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import cpu_model, loadavg, logger  # noqa: E402

log = logger("cli_startup")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ("--help", "--version", "train --help", "evaluate --help", "analyze ood --help")
HEAVY = ("torch", "ray", "mlflow", "pyarrow", "pandas", "scipy")


def run(args: list[str], package_root: str, importtime: bool = False) -> tuple[float, str]:
    """Seconds of ``python -m asymvlm.cli ARGS`` importing asymvlm from ``package_root`` (its
    working folder: ``-m`` puts that first on the path), and its stderr."""
    env = {**os.environ, "PYTHONPATH": package_root}
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "asymvlm.cli"]
    t0 = time.perf_counter()
    done = subprocess.run(
        [*cmd, *args], cwd=package_root, env=env, capture_output=True, text=True, check=True
    )
    return time.perf_counter() - t0, done.stderr


def imports(args: list[str], package_root: str) -> dict[str, Any]:
    """The heavy libraries ``args`` imports, and its cumulative import seconds."""
    _, trace = run(args, package_root, importtime=True)
    rows = [line.split("|") for line in trace.splitlines() if line.startswith("import time:")]
    top = [(int(r[1]), r[2].strip()) for r in rows[1:] if not r[2].startswith("  ")]
    names = {r[2].strip() for r in rows[1:]}
    return {
        "heavy_imports": [m for m in HEAVY if m in names],
        "import_seconds": round(sum(us for us, _ in top) / 1e6, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", metavar="REF", help="also time the package of this commit")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command and side")
    args = parser.parse_args()

    load = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"current": REPO}
        if args.baseline:
            archive = subprocess.run(
                ["git", "-C", REPO, "archive", args.baseline, "asymvlm"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            sides["baseline"] = tmp
        run(["--version"], REPO)  # the file cache warmed
        seconds: dict[str, dict[str, list[float]]] = {c: {s: [] for s in sides} for c in COMMANDS}
        for i in range(args.repeats):
            log(f"repeat {i + 1}/{args.repeats}")
            for command in COMMANDS:
                for side, root in sides.items():
                    seconds[command][side].append(run(command.split(), root)[0])
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare = time.perf_counter() - t0
        result: dict[str, Any] = {}
        for command in COMMANDS:
            row: dict[str, Any] = {}
            for side, root in sides.items():
                prefix = "" if side == "current" else "baseline_"
                row[prefix + "seconds"] = round(statistics.median(seconds[command][side]), 3)
                row |= {prefix + k: v for k, v in imports(command.split(), root).items()}
            if args.baseline:
                row["ratio"] = round(row["seconds"] / row["baseline_seconds"], 3)
            result[f"asymvlm {command}"] = row
    print(
        json.dumps(
            {
                "commands": result,
                "python_startup_seconds": round(bare, 3),
                "baseline": args.baseline,
                "repeats": args.repeats,
                "cpu": cpu_model(),
                "cpus": os.cpu_count(),
                "loadavg_1min_before_after": [load, loadavg()],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
