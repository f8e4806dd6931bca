"""One sweep trial: the paper's protocol for one (method, lr, seed), as a Tune trainable.

Two ways to run it, both reporting the same rows (every epoch, then the selection score and
the outcome) and both resuming from their latest checkpoint when Tune retries them:

* :func:`direct_trial` (``num_workers: 1``, the default way): the protocol runs inside the Tune
  trial itself, on the CPUs (or fraction of a GPU) the trial reserves -- no Ray Train
  ``TorchTrainer`` to start per trial. The Tune actors are reused from trial to trial, and the
  splits a trial reads stay in its process (:data:`asymvlm.splits.PROCESS_CACHE`), so the
  later trials on the same actor start training at once.
* :func:`packed_trial` (``pack: K``): up to K trials of one method and stage trained as one
  batched model in one trial (:func:`asymvlm.protocol.run_packed_protocol`).
* :func:`torch_trainer_trial` (``num_workers > 1``, or ``trial_runner: torch_trainer``): the
  trial drives a ``TorchTrainer`` (:mod:`pipelines.ray_train`), DDP over ``num_workers``.

A trial's config is ``{"sweep": SweepConfig, "stage", "trial": {method, lr, seed}}`` (``"pack":
[trials]`` for a pack; ``"resume"``: the checkpoint an earlier run of the sweep left, see
:mod:`pipelines.tuning.journal`): the validated sweep crosses the Tune boundary as it is, and
the trial's run is :meth:`~pipelines.schema.SweepConfig.run_spec` of what varies -- typed, not
validated again. Checkpoints are checkpoint folders of :mod:`asymvlm.checkpoints`.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from asymvlm import results, storage
from asymvlm.checkpoints import read_pack_state, read_run_state, save_pack_checkpoint
from asymvlm.errors import AsymVLMError, TrialFailed
from asymvlm.protocol import RunSpec, run_protocol
from asymvlm.training import EpochRow, History, Trainer
from pipelines.ray_train import (
    checkpoint_folder,
    maybe_inject_failure,
    run_training,
    worker_logging,
)
from pipelines.schema import SweepConfig
from pipelines.session import ship_by_value

if TYPE_CHECKING:
    from asymvlm.training import PackedTrainer

if __name__ != "__main__":  # workers may lack pipelines/ on their path
    ship_by_value(__name__)

__all__ = [
    "FAILED_MARKER",
    "SELECTION_METRIC",
    "direct_trial",
    "failure_reason",
    "final_report",
    "packed_trial",
    "torch_trainer_trial",
    "trial_run",
    "use_reserved_cpus",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
SELECTION_METRIC = "val_mean_recall_at_1"
#: Written beside a trial that failed for good (it diverged): a retry re-raises at once.
FAILED_MARKER = "failed-for-good.txt"


def trial_run(config: dict[str, Any], trial: dict[str, Any] | None = None) -> RunSpec:
    """The run of a trial (``trial``: one member of a pack): the sweep's
    :meth:`~pipelines.schema.SweepConfig.run_spec` of its method, lr and seed."""
    trial = trial or config["trial"]
    sweep: SweepConfig = config["sweep"]
    return sweep.run_spec(trial["method"], trial["lr"], trial["seed"])


def use_reserved_cpus(sweep: SweepConfig) -> None:
    """Torch threads = the CPUs the trial reserved. Ray sets ``OMP_NUM_THREADS`` for a trial's
    process, but a process that imported torch before (a reused actor, a worker that preloaded
    torch) keeps the thread count it started with: two trials of one CPU each would then run
    two threads each on two CPUs."""
    torch.set_num_threads(max(1, int(sweep.cpus_per_worker)))


def _device() -> torch.device:
    """The trial's device: the GPU (share) Ray gave it, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _resume_point(read: Callable[[str], T], config: dict[str, Any]) -> T | None:
    """What the trial's latest checkpoint holds (``read`` of its folder): Tune's, when Tune
    retries the trial, else ``config["resume"]``, the checkpoint (a folder URI) an earlier run
    of the sweep left (:mod:`pipelines.tuning.journal`); None for a trial that starts fresh."""
    from ray import tune

    checkpoint = tune.get_checkpoint()
    if checkpoint is None and config.get("resume"):
        checkpoint = tune.Checkpoint(*storage.ray_storage(config["resume"]))
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return read(directory)


def final_report(config: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """The trial's last row: the selection score (mean validation Recall@1 of both directions)
    and the whole outcome."""
    trial = config["trial"]
    val = results.retrieval_metric_names(out.get("val", {}), prefix="val_")
    score = [val[k] for k in ("val_t2i_recall_at_1", "val_i2t_recall_at_1") if k in val]
    return {
        SELECTION_METRIC: sum(score) / len(score) if score else float("nan"),
        "method": trial["method"],
        "lr": float(trial["lr"]),
        "seed": int(trial["seed"]),
        "stage": config["stage"],
        "outcome": out,
    }


# -- in place -----------------------------------------------------------------------------------
def direct_trial(config: dict[str, Any]) -> None:
    """Tune function trainable: :func:`asymvlm.protocol.run_protocol` in this process.

    Reports every epoch's row (with a checkpoint when due: a checkpoint folder, as a Ray
    Train run's, :func:`pipelines.ray_train.checkpoint_folder`), resumes from Tune's checkpoint
    on a retry, and ends with :func:`final_report`. A diverged run fails the trial (Tune error
    state) with the trainer's message; a retry of it fails at once instead of diverging
    again."""
    from ray import tune

    # Imported here, in the trial's process: the cache is that process's (this module's
    # functions travel by value, and a global would travel as a copy).
    from asymvlm.splits import PROCESS_CACHE

    if "pack" in config:
        return packed_trial(config)
    sweep: SweepConfig = config["sweep"]
    spec = trial_run(config)
    trial_dir = tune.get_context().get_trial_dir()
    marker = os.path.join(trial_dir, FAILED_MARKER) if trial_dir else None
    if marker and os.path.exists(marker):
        with open(marker) as fh:
            raise TrialFailed(fh.read().strip())
    worker_logging(0, label="trial")
    use_reserved_cpus(sweep)
    state = _resume_point(read_run_state, config)

    def on_epoch(row: EpochRow, trainer: Trainer, history: History, due: bool) -> None:
        if due:
            with checkpoint_folder(trainer, history) as folder:
                tune.report(row, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(row)
        maybe_inject_failure(sweep.fault_injection, trainer.epoch, 0)

    try:
        out = run_protocol(
            spec, device=_device(), state=state, on_epoch=on_epoch, cache=PROCESS_CACHE
        )
    except AsymVLMError as exc:
        raise TrialFailed(failure_reason(exc)) from None
    assert out is not None  # rank 0
    if out.get("diverged"):
        reason = " ".join(str(out["diverged"]).split())
        if marker:
            with open(marker, "w") as fh:
                fh.write(reason + "\n")
        raise TrialFailed(reason)
    tune.report(final_report(config, out))


# -- packed -------------------------------------------------------------------------------------
def packed_trial(config: dict[str, Any]) -> None:
    """The trials ``config["pack"]`` (one method, one stage, other lr/seed) trained as one
    batched model (:func:`asymvlm.protocol.run_packed_protocol`). Every epoch of every member
    is reported as ``{"member": k, **row}``; when a checkpoint is due (``checkpoint_every``, and
    after a member's last epoch) the last report of the epoch carries the pack's checkpoint
    (:func:`asymvlm.checkpoints.save_pack_checkpoint`), from which Tune's retry resumes the
    pack; the last one holds every finished member's adapter. The end is one report with each
    member's final row (:func:`final_report`) or failure (``{"failed": reason}``) under
    ``"pack_outcomes"``. A member that diverges fails alone. (A sweep packs only methods
    trained by SGD.)"""
    from ray import tune

    from asymvlm.protocol import run_packed_protocol
    from asymvlm.splits import PROCESS_CACHE

    sweep: SweepConfig = config["sweep"]
    members = config["pack"]
    worker_logging(0, label="pack")
    use_reserved_cpus(sweep)
    specs = [trial_run(config, t) for t in members]
    state = _resume_point(read_pack_state, config)
    rows: list[EpochRow] = []  # the epoch's reports, sent when the pack is whole

    def on_epoch(k: int, row: EpochRow, trainer: Trainer, history: History) -> None:
        rows.append({"member": k, **row})

    def on_state(pack: PackedTrainer) -> None:
        if not rows:  # every member left in the pack diverged in this epoch
            return
        *before, last = rows
        rows.clear()
        for row in before:
            tune.report(row)
        epoch = int(last["epoch"])
        if specs[0].checkpoint_due(epoch):
            with tempfile.TemporaryDirectory() as directory:
                save_pack_checkpoint(directory, pack)
                tune.report(last, checkpoint=tune.Checkpoint.from_directory(directory))
        else:
            tune.report(last)
        maybe_inject_failure(sweep.fault_injection, epoch, 0)

    try:
        outs = run_packed_protocol(
            specs,
            device=_device(),
            on_epoch=on_epoch,
            on_state=on_state,
            cache=PROCESS_CACHE,
            state=state,
        )
    except AsymVLMError as exc:
        raise TrialFailed(failure_reason(exc)) from None
    outcomes = [
        {"failed": " ".join(str(out["diverged"]).split())}
        if out.get("diverged")
        else final_report({"trial": trial, "stage": config["stage"]}, out)
        for trial, out in zip(members, outs, strict=True)
    ]
    tune.report({"pack_outcomes": outcomes})


# -- through a TorchTrainer ---------------------------------------------------------------------
def torch_trainer_trial(config: dict[str, Any]) -> None:
    """Tune function trainable: one Ray Train run (DDP over ``num_workers``); reports every
    epoch live (``TuneReportCallback``) and ends with :func:`final_report`."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    sweep: SweepConfig = config["sweep"]
    trial = config["trial"]
    try:
        out = run_training(
            trial_run(config),
            callbacks=[TuneReportCallback()],  # every epoch's report reaches the driver live
            name=f"{config['stage']}-{trial['method']}-lr{trial['lr']:g}-seed{trial['seed']}",
            storage_path=storage.uri_join(sweep.output, "ray"),
            num_workers=sweep.num_workers,
            cpus_per_worker=sweep.cpus_per_worker,
            gpus_per_worker=sweep.gpus_per_worker,
            max_failures=sweep.max_failures,
            fault=sweep.fault_injection,
        )
    except Exception as exc:  # the trial fails (Tune error state) with a readable reason
        raise TrialFailed(failure_reason(exc)) from None
    tune.report(final_report(config, out))


# -- failures -----------------------------------------------------------------------------------
def failure_reason(exc: BaseException | str | None) -> str:
    """The root cause of a failed trial as one line: our own errors (e.g. "non-finite loss at
    epoch 2, step 3 ...") verbatim, others as ``Type: first line``; digs through Ray's
    wrappers (task errors, Train worker-group errors, Tune errors)."""
    if exc is None:
        return "unknown error"
    if isinstance(exc, str):  # Tune's text trace: the last "Error: message" line
        lines = [ln.strip() for ln in exc.strip().splitlines() if ln.strip()]
        hits = [ln for ln in lines if "non-finite" in ln] or [
            ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Failed)\b", ln)
        ]
        return (hits[-1] if hits else (lines[-1] if lines else "unknown error"))[:500]
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    chain: list[BaseException] = []
    while stack:
        err = stack.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        chain.append(err)
        cause = getattr(err, "cause", None)  # RayTaskError(X) is also an X: use its cause
        if isinstance(cause, BaseException):
            stack.insert(0, cause)
            continue
        if isinstance(err, TrialFailed | AsymVLMError):
            return " ".join(str(err).split())[:500]
        stack += list(getattr(err, "worker_failures", {}).values())
        stack += [e for e in (err.__cause__, err.__context__) if isinstance(e, BaseException)]
    root = chain[-1]
    first = (str(root).strip().splitlines() or [""])[0]
    return f"{type(root).__name__}: {first}"[:500]
