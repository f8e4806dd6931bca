"""``asymvlm report`` and ``asymvlm ui``: an MLflow store as a report or in the UI."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from asymvlm.cli.flags import Help, add_tracking_uri
from asymvlm.errors import ConfigError
from asymvlm.extras import check_extras

logger = logging.getLogger(__name__)
#: What MLflow's server prints at import (its FastAPI app wraps Flask in Starlette's WSGI shim).
STARLETTE_WSGI_WARNING = "starlette.middleware.wsgi is deprecated"
COMMANDS = {
    "report": "gather an MLflow experiment into report.md / report.html with tables and figures",
    "ui": "open a pipeline's MLflow store in the MLflow UI",
}


def cmd_report(args: argparse.Namespace) -> int:
    check_extras("tracking")  # it reads MLflow runs: that extra is named first
    from asymvlm.checkpoints.sharing import NO_STORE
    from asymvlm.report.document import build_report

    if not args.tracking_uri:
        raise ConfigError(f"report: {NO_STORE}")
    path = build_report(args.tracking_uri, args.experiment, args.output)
    logger.info("report written to %s (and report.html beside it)", path)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from asymvlm import tracking

    database = os.path.join(os.path.abspath(args.output), "mlflow.db")
    if not os.path.isfile(database):
        raise ConfigError(
            f"{args.output}: no mlflow.db here (a pipeline's output folder holds "
            "one when it ran with the local default store)"
        )
    uri = "sqlite:///" + database
    tracking.relocate_local_store(uri)
    where = ["--host", args.host, "--port", str(args.port), "--workers", "1"]
    logger.info("MLflow UI on http://%s:%d (Ctrl-C stops it)", args.host, args.port)
    # One reader needs one worker and no job runner (MLflow starts 4 workers and a GenAI job
    # runner, each importing MLflow: 4x as long on 2 cores, and a Starlette warning per worker).
    warnings = [os.environ.get("PYTHONWARNINGS"), f"ignore:{STARLETTE_WSGI_WARNING}"]
    env = os.environ | {
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "PYTHONWARNINGS": ",".join(filter(None, warnings)),
    }
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, *where]
    os.execve(sys.executable, command, env)
    return 0  # not reached


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help=COMMANDS["report"], formatter_class=Help)
    add_tracking_uri(p, "(e.g. sqlite:///runs/demo/mlflow.db) the runs are read from")
    p.add_argument("--experiment", required=True, help="MLflow experiment to gather")
    p.add_argument("--output", required=True, help="folder for report.md and the figures")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "ui",
        help=COMMANDS["ui"],
        description="Runs `mlflow ui` on OUTPUT/mlflow.db (a store copied or moved elsewhere "
        "is pointed at the mlartifacts folder beside it first).",
        formatter_class=Help,
    )
    p.add_argument("output", help="the pipeline's output folder (holding mlflow.db)")
    p.add_argument("--port", type=int, default=5000, help="port of the UI")
    p.add_argument("--host", default="127.0.0.1", help="address the UI listens on")
    p.set_defaults(func=cmd_ui)
