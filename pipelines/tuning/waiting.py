"""Trials that wait too long for a node end the sweep: :class:`NodeWait` (Tune has no such
limit: a lost node's trials stay PENDING until one joins)."""

from __future__ import annotations

import logging
import time
from typing import Any

from ray import tune

from asymvlm.errors import Unfinished
from pipelines.tuning.search import describe_trial

__all__ = ["NodeWait"]

logger = logging.getLogger("pipelines.sweep")


class NodeWait(tune.Callback):
    """Tune callback on the driver: raises :class:`~asymvlm.errors.Unfinished` (the sweep
    stops) once trials have waited ``seconds`` for a node while no trial ran."""

    def __init__(self, seconds: float, label: str) -> None:
        self.seconds, self.label = float(seconds), label
        self._since: float | None = None
        self._warned = False

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        waiting = [t for t in trials if t.status == "PENDING"]
        if not waiting or any(t.status == "RUNNING" for t in trials):
            self._since, self._warned = None, False
            return
        now = time.monotonic()
        self._since = self._since or now
        waited = now - self._since
        if not self._warned and waited >= self.seconds / 2:
            self._warned = True
            logger.warning(
                "sweep %s: %d trial(s) wait for a node with room for them (the sweep "
                "stops after %.0f s: node_wait_s)",
                self.label,
                len(waiting),
                self.seconds,
            )
        if waited < self.seconds:
            return
        unfinished = [t for t in trials if t.status not in ("TERMINATED", "ERROR")]
        names = "; ".join(describe_trial(t.config) for t in unfinished)
        raise Unfinished(
            f"sweep {self.label}: no node could run its trials for {self.seconds:.0f} s "
            f"(node_wait_s); not finished: {names}. The finished trials are kept: run the same "
            "command again, with nodes to run on, to go on from their checkpoints"
        )
