"""A sweep trial, :func:`sweep_trial`: its members trained and evaluated (App. B.4) in the Tune
trial's process (several as one batched model), resumed from Tune's checkpoint; why one failed
(:func:`failure_reason`)."""

from __future__ import annotations

import re
import tempfile
from typing import Any

import torch
from ray import tune

from asymvlm.checkpoints import read_pack_state, read_run_state, save_pack_checkpoint
from asymvlm.errors import AsymVLMError, TrialFailed, one_line
from asymvlm.runner import train_and_evaluate, train_and_evaluate_packed
from asymvlm.splits import PROCESS_CACHE
from asymvlm_ray.ray_train import checkpoint_folder, maybe_inject_failure, worker_logging
from asymvlm_ray.schema import SweepConfig
from asymvlm_ray.tuning.lr_selection import validation_score
from asymvlm_ray.tuning.records import FailedTrial, TrialConfig, TrialOutcome, TrialReport


def _state(read):
    """``read`` of Tune's checkpoint of this trial (a retry, a restored sweep), else None."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return read(directory)


def _diverged(out: dict[str, Any]) -> str | None:
    """Why a run's results say it diverged, on one line; None when it did not."""
    return " ".join(str(out["diverged"]).split()) if out.get("diverged") else None


def sweep_trial(config: dict[str, Any], sweep: SweepConfig) -> None:
    """The Tune trial of ``config`` (a :class:`TrialConfig`) in ``sweep`` (given by
    ``tune.with_parameters``): its last report a :class:`TrialReport`. A member that diverged
    (or fails) alone fails the trial; one of a pack is a :class:`FailedTrial`."""
    trial = TrialConfig.model_validate(config)
    specs = [sweep.run_spec(p.method, p.lr, p.seed) for p in trial.members]
    worker_logging(0, label="trial")
    torch.set_num_threads(max(1, int(sweep.cpus_per_worker)))  # the CPUs the trial reserved
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        outs = (_in_place if len(specs) == 1 else _packed)(sweep, specs, device)
    except Exception as exc:  # the trial fails (Tune error state) with a readable reason
        raise TrialFailed(failure_reason(exc)) from None
    reasons = [_diverged(out) for out in outs]
    if len(specs) == 1 and reasons[0]:
        raise TrialFailed(reasons[0])
    outcomes: list[TrialOutcome | FailedTrial] = []
    for point, out, reason in zip(trial.members, outs, reasons, strict=True):
        member = {**point.model_dump(), "stage": trial.stage}
        if reason:
            outcomes.append(FailedTrial(**member, reason=reason))
        else:
            score = validation_score(out)
            outcomes.append(TrialOutcome(**member, val_mean_recall_at_1=score, outcome=out))
    tune.report(TrialReport(outcomes=outcomes).model_dump())


def _in_place(sweep: SweepConfig, specs: list, device: torch.device) -> list[dict[str, Any]]:
    """One run, each epoch reported (with a checkpoint when one is due)."""

    def on_epoch(row, trainer, history, due: bool) -> None:
        if due:
            with checkpoint_folder(trainer, history) as folder:
                tune.report(row, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(row)
        maybe_inject_failure(sweep.fault_injection, trainer.epoch, 0)

    state = _state(read_run_state)
    return [
        train_and_evaluate(
            specs[0], device=device, state=state, on_epoch=on_epoch, cache=PROCESS_CACHE
        )
    ]


def _packed(sweep: SweepConfig, specs: list, device: torch.device) -> list[dict[str, Any]]:
    """Every member's epoch reported as ``{"member": k, **row}``, the last with the checkpoint."""
    rows: list[dict[str, Any]] = []

    def on_state(pack) -> None:
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

    def on_epoch(k: int, row: dict[str, Any], trainer, history) -> None:
        rows.append({"member": k, **row})

    return train_and_evaluate_packed(
        specs,
        device=device,
        on_epoch=on_epoch,
        on_state=on_state,
        cache=PROCESS_CACHE,
        state=_state(read_pack_state),
    )


def failure_reason(exc: BaseException | str | None) -> str:
    """The root cause of a failed trial on one line, under Ray's wrappers: our errors verbatim,
    others as ``Type: message``; a text trace (or a message holding one): a subprocess's
    ``ERROR:`` line (pip's, under a runtime_env that did not install), else its last error line."""
    while isinstance(getattr(exc, "cause", None), BaseException):  # RayTaskError(X): X
        exc = exc.cause
    if isinstance(exc, AsymVLMError):
        return one_line(exc)[:500]
    if isinstance(exc, BaseException):
        exc = f"{type(exc).__name__}: {str(exc).strip()}"
        if "\n" not in exc:
            return exc[:500]
    trace = exc or ""
    errors = re.findall(r"^\s*ERROR: (.+)$", trace, re.M) or re.findall(
        r"^\s*([\w.]+(?:Error|Exception|Failed)\b.*)$", trace, re.M
    )
    return errors[-1].strip()[:500] if errors else "unknown error"
