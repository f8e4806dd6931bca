"""The sweep's trials as one Tune experiment (:func:`run_trials`): each method's lr grid at the
first seed, then its other seeds at its chosen lr as soon as its grid has ended, while the other
methods' grids still run (:class:`StagedSearch`); a sweep that stopped part-way is restored."""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import time
from collections import Counter, defaultdict
from typing import Any

from ray import tune
from ray.tune.search import Searcher

from asymvlm import storage
from asymvlm.errors import Unfinished
from asymvlm.methods import METHODS
from asymvlm_ray.schema import SweepConfig
from asymvlm_ray.tuning.lr_selection import select_lr
from asymvlm_ray.tuning.records import (
    FailedTrial,
    MemberCheckpoint,
    Stage,
    SweepPoint,
    TrialConfig,
    TrialOutcome,
    TrialReport,
)
from asymvlm_ray.tuning.trials import failure_reason, sweep_trial

logger = logging.getLogger(__name__)

KEEP_CHECKPOINTS = 2  # per trial, the latest
#: The members that finished (each with its adapter's checkpoint), and those that failed.
Results = tuple[list[TrialOutcome], list[FailedTrial]]


def packed(sweep: SweepConfig, stage: Stage, points: list[SweepPoint]) -> list[TrialConfig]:
    """``points`` as trials: up to ``sweep.pack`` consecutive points of one method trained by
    SGD go as one trial (one packed model), any other point alone."""
    groups: list[list[SweepPoint]] = []
    for point in points:
        last = groups[-1] if groups else []
        same = last and last[0].method == point.method and len(last) < sweep.pack
        if same and METHODS[point.method].trainable:
            last.append(point)
        else:
            groups.append([point])
    return [TrialConfig(stage=stage, members=members) for members in groups]


class StagedSearch(Searcher):
    """Tune's searcher of a sweep: the grid's trials first (with one lr, every seed at once), each
    method's other seeds at its chosen lr (:func:`~.lr_selection.select_lr`) once its grid ended."""

    def __init__(self, sweep: SweepConfig) -> None:
        super().__init__()
        self.sweep = sweep
        self.queue: list[TrialConfig] = []  # to suggest, in order
        self.live: dict[str, TrialConfig] = {}  # by Tune's trial id
        self.grid_left: Counter[str] = Counter()  # method -> its grid trials not ended
        self.grid_done: dict[str, list[TrialOutcome]] = defaultdict(list)  # method -> finished
        for method in sweep.methods:
            if sweep.selects_lr:
                points = [SweepPoint(method=method, lr=lr, seed=sweep.seeds[0]) for lr in sweep.lr]
                grid = packed(sweep, "grid", points)
                self.queue += grid
                self.grid_left[method] = len(grid)
            else:
                self._queue_seeds(method, sweep.lr[0], sweep.seeds)

    def _queue_seeds(self, method: str, lr: float, seeds: list[int]) -> None:
        """``method``'s trials at ``lr`` with ``seeds``, after those queued."""
        points = [SweepPoint(method=method, lr=lr, seed=s) for s in seeds]
        self.queue += packed(self.sweep, "seeds", points)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Tune runs the trials the cluster fits; its limit sets how many wait."""
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The next trial's config (:class:`TrialConfig`); None: wait for a grid to end."""
        if not self.queue:
            return None if self.live else Searcher.FINISHED
        trial = self.queue.pop(0)
        self.live[trial_id] = trial
        return trial.model_dump()

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error=False) -> None:
        """A grid trial ended: the method's last queues its other seeds at the lr its grid chose."""
        trial = self.live.pop(trial_id)
        if trial.stage != "grid":
            return
        method = trial.members[0].method
        reported = TrialReport.of(result, len(trial.members))
        self.grid_done[method] += [r for r in reported if isinstance(r, TrialOutcome)]
        self.grid_left[method] -= 1
        pick = None if self.grid_left[method] else select_lr(self.grid_done[method]).get(method)
        if pick is not None:
            self._queue_seeds(method, pick.lr, self.sweep.seeds[1:])

    def save(self, checkpoint_path: str) -> None:
        """Its state, in Tune's experiment state (a restored sweep goes on from it)."""
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))


class NodeWait(tune.Callback):
    """:class:`~asymvlm.errors.Unfinished` once trials waited ``seconds`` for a node, none ran."""

    def __init__(self, seconds: float, label: str) -> None:
        self.seconds = seconds
        self.label = label
        self.since: float | None = None  # since when trials wait and none runs

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        """After each step of Tune's loop: how long trials have waited while none ran."""
        statuses = {t.status for t in trials}
        if "RUNNING" in statuses or "PENDING" not in statuses:
            self.since = None
            return
        self.since = self.since or time.monotonic()
        if time.monotonic() - self.since < self.seconds:
            return
        waiting = [t for t in trials if t.status not in ("TERMINATED", "ERROR")]
        names = "; ".join(
            " + ".join(p.shown() for p in TrialConfig.model_validate(t.config).members)
            for t in waiting
        )
        raise Unfinished(
            f"sweep {self.label}: no node could run its trials for {self.seconds:.0f} s "
            f"(node_wait_s); not finished: {names}. The finished trials are kept: run the same "
            "command again, with nodes to run on, to go on from their checkpoints"
        )


def experiment_name(sweep: SweepConfig) -> str:
    """``sweep-<digest>``: the experiment of what the sweep trains (a rerun restores it)."""
    runs = [sweep.run_spec(m, lr, s) for m in sweep.methods for lr in sweep.lr for s in sweep.seeds]
    specs = [sweep.pack, [run.model_dump(mode="json") for run in runs]]
    return "sweep-" + hashlib.sha1(json.dumps(specs, sort_keys=True).encode()).hexdigest()[:10]


def run_trials(sweep: SweepConfig, callback: tune.Callback) -> Results:
    """Every trial of the sweep (both stages), ``callback`` told of each event: the members
    that finished (each with its adapter's checkpoint), those that failed with the reason."""
    import ray

    root, fs = storage.ray_storage(storage.uri_join(sweep.output, "tune", "trials"))
    gpu = sweep.gpus_per_worker if ray.cluster_resources().get("GPU", 0) > 0 else 0
    trainable = tune.with_resources(
        tune.with_parameters(sweep_trial, sweep=sweep),
        {"cpu": sweep.cpus_per_worker, "gpu": gpu},
    )
    name = experiment_name(sweep)
    path = f"{root}/{name}"
    if tune.Tuner.can_restore(path, storage_filesystem=fs):
        logger.info("sweep %s goes on where it stopped (%s)", sweep.label, path)
        tuner = tune.Tuner.restore(path, trainable, storage_filesystem=fs)
    else:
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=StagedSearch(sweep),
                num_samples=-1,
                # every trial may wait for a slot
                max_concurrent_trials=len(sweep.methods) * len(sweep.lr) * len(sweep.seeds),
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=root,
                storage_filesystem=fs,
                callbacks=[callback, NodeWait(sweep.node_wait_s, sweep.label)],
                failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
                verbose=0,
            ),
        )
    return _read_results(tuner.fit(), path, fs)


def _read_results(result_grid: tune.ResultGrid, path: str, fs: Any) -> Results:
    """The members of the experiment at ``path``: those that finished, those that failed."""
    done: list[TrialOutcome] = []
    failed: list[FailedTrial] = []
    # A trial whose actor never started (its runtime_env did not install) has no result: its
    # config is in Tune's own record.
    configs: dict[str, dict[str, Any]] = {}
    if any(r.config is None for r in result_grid):
        analysis = tune.ExperimentAnalysis(path, storage_filesystem=fs)
        configs = {trial.path: trial.config for trial in analysis.trials}
    for r in result_grid:
        trial = TrialConfig.model_validate(r.config or configs[r.path])
        size = len(trial.members)
        reported = TrialReport.of(r.metrics if r.error is None else None, size)
        for k, (point, got) in enumerate(zip(trial.members, reported, strict=True)):
            if isinstance(got, TrialOutcome):
                where = MemberCheckpoint(r.checkpoint, k, size)
                done.append(got.model_copy(update={"adapter": where}))
            elif got is not None:  # a pack's member that diverged
                failed.append(got)
            else:  # the trial failed, or never started
                reason = failure_reason(r.error)
                failed.append(FailedTrial(**point.model_dump(), stage=trial.stage, reason=reason))
    return done, failed
