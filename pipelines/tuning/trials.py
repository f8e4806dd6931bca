"""One sweep trial, the paper's protocol for one (method, lr, seed), as a Tune trainable: in
the trial's process (:func:`direct_trial`), several trials batched as one model
(:func:`packed_trial`), or through a TorchTrainer (:func:`torch_trainer_trial`). Each reports
every epoch, then :func:`final_report`, and resumes from its latest checkpoint on a retry."""

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

if TYPE_CHECKING:
    from asymvlm.training import PackedTrainer

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
    """Torch threads = the CPUs the trial reserved (a reused actor keeps the count it started
    with, whatever ``OMP_NUM_THREADS`` says)."""
    torch.set_num_threads(max(1, int(sweep.cpus_per_worker)))


def _device() -> torch.device:
    """The trial's device: the GPU (share) Ray gave it, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _resume_point(read: Callable[[str], T], config: dict[str, Any]) -> T | None:
    """``read`` of the trial's latest checkpoint: Tune's on a retry, else ``config["resume"]``
    (left by an earlier run of the sweep); None for a fresh trial."""
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
    """:func:`asymvlm.protocol.run_protocol` in the trial's process, reporting every epoch (with
    a checkpoint when due). A diverged run fails the trial, and a retry of it fails at once."""
    from ray import tune

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
    """The trials ``config["pack"]`` (one method and stage) trained as one batched model
    (:func:`asymvlm.protocol.run_packed_protocol`): every member's epoch reported as ``{"member":
    k, **row}``, the last of an epoch with the pack's checkpoint when due; at the end each
    member's :func:`final_report` or ``{"failed": reason}`` under ``"pack_outcomes"``."""
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
    """The root cause of a failed trial on one line: our errors verbatim, others as ``Type:
    first line``, through Ray's wrappers."""
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
