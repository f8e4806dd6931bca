"""Both stages of a sweep as one Tune experiment: :class:`StagedSearch`.

Stage 1 (the lr grid at the first seed) and stage 2 (every other seed at each method's chosen
lr) used to be two Tune experiments, one after the other. Here they are one, and a method's
second stage starts as soon as *its* grid trials have ended (the lr of one method is chosen
from that method's validation scores alone), while other methods' grid trials still run: the
trial actors, and the tables they keep in memory, go on from trial to trial without a gap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.tune.search import Searcher

#: ``select(method, grid_trial_ids) -> that method's stage-2 trials``: called once per method,
#: when every grid trial of the method has ended, with the Tune trial ids of those that did not
#: fail (Tune hands searchers flattened results: the caller keeps the trials' own rows).
Select = Callable[[str, list[str]], list[dict[str, Any]]]


class StagedSearch(Searcher):
    """Suggests ``{"stage": "grid", "trial": t}`` for every ``t`` of ``grid`` (``{"method",
    "lr", "seed"}``), and for each of ``methods``, once its grid trials have ended (at once for
    a method with none), ``{"stage": "seeds", "trial": t}`` for every ``t`` that ``select``
    returns; then finishes."""

    def __init__(self, methods: list[str], grid: list[dict[str, Any]], select: Select) -> None:
        super().__init__()
        self._queue: list[tuple[str, dict[str, Any]]] = [("grid", t) for t in grid]
        self._select = select
        self._waiting = {m: sum(t["method"] == m for t in grid) for m in methods}
        self._finished: dict[str, list[str]] = {m: [] for m in methods}
        self._method_of: dict[str, str] = {}
        self._running: set[str] = set()

    def _release(self) -> None:
        """Queue the second stage of every method whose grid has ended."""
        for method in [m for m, n in self._waiting.items() if n == 0]:
            del self._waiting[method]
            self._queue += [("seeds", t) for t in self._select(method, self._finished[method])]

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        self._release()
        if self._queue:
            stage, trial = self._queue.pop(0)
            self._running.add(trial_id)
            if stage == "grid":
                self._method_of[trial_id] = trial["method"]
            return {"stage": stage, "trial": trial}
        return None if self._running or self._waiting else Searcher.FINISHED

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self._running.discard(trial_id)
        method = self._method_of.pop(trial_id, None)
        if method is not None:  # a grid trial
            self._waiting[method] -= 1
            if not error:
                self._finished[method].append(trial_id)
