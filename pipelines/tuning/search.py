"""Both stages of a sweep as one Tune experiment: :class:`StagedSearch` (a method's second
stage starts as soon as its own grid has ended)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray.tune.search import Searcher

if TYPE_CHECKING:
    from pipelines.tuning.journal import Previous

#: ``select(method, ids of its grid trials that did not fail) -> its stage-2 trials``.
Select = Callable[[str, list[str]], list[dict[str, Any]]]


def describe_trial(config: dict[str, Any]) -> str:
    """``asymvlm-vmf lr=0.002 seed=0`` (a pack: its members, joined by ``+``)."""
    members = config.get("pack") or [config["trial"]]
    return " + ".join(f"{t['method']} lr={t['lr']:g} seed={t['seed']}" for t in members)


def member_keys(trial_id: str, size: int) -> list[str]:
    """The keys of a trial's runs: the trial id, or ``<trial id>#<k>`` for the members of a
    pack of ``size`` > 1."""
    return [trial_id] if size == 1 else [f"{trial_id}#{k}" for k in range(size)]


class StagedSearch(Searcher):
    """Suggests ``{"stage": "grid", "trial": t}`` for every ``t`` of ``grid`` (``{"method",
    "lr", "seed"}``), and for each of ``methods``, once its grid trials have ended (at once for
    a method with none), ``{"stage": "seeds", "trial": t}`` for every ``t`` that ``select``
    returns; then finishes. With ``pack`` > 1, up to that many consecutive trials of one
    method in ``packable`` and one stage go out as one suggestion (``"pack"``: the members).

    ``previous`` (an earlier run of the sweep, :class:`~pipelines.tuning.journal.Previous`):
    a trial that finished there is not suggested again -- ``read_back(stage, trial)`` gives its
    key, and it counts as finished -- and one that stopped on the way is suggested with
    ``"resume"``, its latest checkpoint."""

    def __init__(
        self,
        methods: list[str],
        grid: list[dict[str, Any]],
        select: Select,
        pack: int = 1,
        packable: frozenset[str] = frozenset(),
        previous: Previous | None = None,
        read_back: Callable[[str, dict[str, Any]], str] | None = None,
    ) -> None:
        super().__init__()
        self._pack, self._packable = pack, packable
        self._previous, self._read_back = previous, read_back
        self._select = select
        self._finished: dict[str, list[str]] = {m: [] for m in methods}
        grid = self._not_finished("grid", grid)
        self._queue: list[tuple[str, dict[str, Any]]] = [("grid", t) for t in grid]
        self._waiting = {m: sum(t["method"] == m for t in grid) for m in methods}
        self._method_of: dict[str, str] = {}
        self._size: dict[str, int] = {}
        self._running: set[str] = set()

    def _not_finished(self, stage: str, trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``trials`` but those an earlier run finished (read back: a grid trial's key joins
        its method's finished ones)."""
        if self._previous is None or self._read_back is None:
            return trials
        left = []
        for t in trials:
            if self._previous.finished(stage, t):
                key = self._read_back(stage, t)
                if stage == "grid":
                    self._finished[t["method"]].append(key)
            else:
                left.append(t)
        return left

    def _release(self) -> None:
        """Queue the second stage of every method whose grid has ended."""
        for method in [m for m, n in self._waiting.items() if n == 0]:
            del self._waiting[method]
            seeds = self._select(method, self._finished[method])
            self._queue += [("seeds", t) for t in self._not_finished("seeds", seeds)]

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        self._release()
        if self._queue:
            stage, trial = self._queue.pop(0)
            members = [trial]
            if trial["method"] in self._packable:  # the next ones of this method and stage
                while (
                    len(members) < self._pack
                    and self._queue
                    and self._queue[0][0] == stage
                    and self._queue[0][1]["method"] == trial["method"]
                ):
                    members.append(self._queue.pop(0)[1])
            self._running.add(trial_id)
            if stage == "grid":
                self._method_of[trial_id] = trial["method"]
                self._size[trial_id] = len(members)
            out: dict[str, Any] = {"stage": stage, "trial": trial}
            if len(members) > 1:
                out["pack"] = members
            resume = self._previous.resume(stage, members) if self._previous else None
            if resume:
                out["resume"] = resume
            return out
        return None if self._running or self._waiting else Searcher.FINISHED

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self._running.discard(trial_id)
        method = self._method_of.pop(trial_id, None)
        if method is not None:  # a grid trial (or pack: its members are "<trial id>#<k>")
            size = self._size.pop(trial_id, 1)
            self._waiting[method] -= size
            if not error:
                self._finished[method] += member_keys(trial_id, size)
