"""Trials that wait for a node: :class:`NodeWait` ends a sweep that waited too long.

When a worker node goes (a spot instance preempted: every process on it and its local disk
gone), Tune retries its trials (``max_failures``) from their latest checkpoints in the shared
storage, as soon as a node with room for them is there -- one that joins later, or one whose
trials end. Until then they are PENDING. If for ``node_wait_s`` seconds trials wait while none
runs, no node is coming: the sweep ends with :class:`~asymvlm.errors.Unfinished` naming the
trials that could not finish; the finished ones are in the sweep's journal
(:mod:`pipelines.tuning.journal`), so the same command run again goes on from there.
"""

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
        if not self._warned and waited >= min(30.0, self.seconds / 2):
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
