"""A sweep trial as a Tune function trainable, :func:`sweep_trial`: the paper's protocol
(App. B.4) for its ``members`` (one (method, lr, seed) each) in the trial's process, several
as one batched model, or through a TorchTrainer. It reports every epoch (a checkpoint when
due), resumes from Tune's checkpoint, and ends with ``{"outcomes": [one per member]}``."""

from __future__ import annotations

import re
import tempfile
from typing import Any

import torch
from ray import tune

from asymvlm import results, storage
from asymvlm.checkpoints import read_pack_state, read_run_state, save_pack_checkpoint
from asymvlm.errors import AsymVLMError, TrialFailed
from asymvlm.protocol import run_packed_protocol, run_protocol
from asymvlm.splits import PROCESS_CACHE
from pipelines.ray_train import (
    checkpoint_folder,
    maybe_inject_failure,
    run_training,
    worker_logging,
)
from pipelines.schema import SweepConfig

__all__ = ["SELECTION_METRIC", "failure_reason", "final_report", "sweep_trial"]

SELECTION_METRIC = "val_mean_recall_at_1"


def use_reserved_cpus(sweep: SweepConfig) -> None:
    """Torch threads = the CPUs the trial reserved (a reused actor keeps its first count)."""
    torch.set_num_threads(max(1, int(sweep.cpus_per_worker)))


def final_report(trial: dict[str, Any], stage: str, out: dict[str, Any]) -> dict[str, Any]:
    """A member's last row: the selection score (mean validation Recall@1 of both directions)
    and the whole outcome."""
    val = results.retrieval_metric_names(out.get("val", {}), prefix="val_")
    score = [val[k] for k in ("val_t2i_recall_at_1", "val_i2t_recall_at_1") if k in val]
    return {
        SELECTION_METRIC: sum(score) / len(score) if score else float("nan"),
        **trial,
        "stage": stage,
        "outcome": out,
    }


def _state(read):
    """``read`` of Tune's checkpoint of this trial (a retry, a restored sweep), else None."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return read(directory)


def _diverged(out: dict[str, Any]) -> str | None:
    return " ".join(str(out["diverged"]).split()) if out.get("diverged") else None


def sweep_trial(config: dict[str, Any]) -> None:
    """The trial ``config`` (``sweep``, ``stage``, ``members``); a member that diverged (or
    fails) alone fails the trial, one of a pack ends ``{"failed": reason}``."""
    sweep: SweepConfig = config["sweep"]
    stage, members = config["stage"], config["members"]
    specs = [sweep.run_spec(t["method"], t["lr"], t["seed"]) for t in members]
    try:
        if sweep.uses_torch_trainer():
            from ray.tune.integration.ray_train import TuneReportCallback

            (trial,) = members
            outs = [
                run_training(
                    specs[0],
                    callbacks=[TuneReportCallback()],  # every epoch reaches the driver live
                    name=f"{stage}-{trial['method']}-lr{trial['lr']:g}-seed{trial['seed']}",
                    storage_path=storage.uri_join(sweep.output, "ray"),
                    num_workers=sweep.num_workers,
                    cpus_per_worker=sweep.cpus_per_worker,
                    gpus_per_worker=sweep.gpus_per_worker,
                    max_failures=sweep.max_failures,
                    fault=sweep.fault_injection,
                )
            ]
        else:
            worker_logging(0, label="trial")
            use_reserved_cpus(sweep)
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            run = _in_place if len(members) == 1 else _packed
            outs = run(sweep, specs, device)
    except Exception as exc:  # the trial fails (Tune error state) with a readable reason
        raise TrialFailed(failure_reason(exc)) from None
    if len(members) == 1 and (reason := _diverged(outs[0])):
        raise TrialFailed(reason)
    outcomes = [
        {"failed": reason} if (reason := _diverged(out)) else final_report(t, stage, out)
        for t, out in zip(members, outs, strict=True)
    ]
    tune.report({"outcomes": outcomes})


def _in_place(sweep: SweepConfig, specs: list, device: torch.device) -> list[dict[str, Any]]:
    def on_epoch(row, trainer, history, due: bool) -> None:
        if due:
            with checkpoint_folder(trainer, history) as folder:
                tune.report(row, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(row)
        maybe_inject_failure(sweep.fault_injection, trainer.epoch, 0)

    state = _state(read_run_state)
    out = run_protocol(specs[0], device=device, state=state, on_epoch=on_epoch, cache=PROCESS_CACHE)
    assert out is not None  # rank 0
    return [out]


def _packed(sweep: SweepConfig, specs: list, device: torch.device) -> list[dict[str, Any]]:
    """:func:`asymvlm.protocol.run_packed_protocol`: every member's epoch reported as
    ``{"member": k, **row}``, the epoch's last with the pack's checkpoint when due."""
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

    return run_packed_protocol(
        specs,
        device=device,
        on_epoch=lambda k, row, trainer, history: rows.append({"member": k, **row}),
        on_state=on_state,
        cache=PROCESS_CACHE,
        state=_state(read_pack_state),
    )


def failure_reason(exc: BaseException | str | None) -> str:
    """The root cause of a failed trial on one line: our errors verbatim, others as ``Type:
    first line``, through Ray's wrappers (a text trace: its last error line)."""
    if exc is None:
        return "unknown error"
    if isinstance(exc, str):
        lines = [ln.strip() for ln in exc.strip().splitlines() if ln.strip()]
        hits = [ln for ln in lines if "non-finite" in ln] or [
            ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Failed)\b", ln)
        ]
        return (hits[-1] if hits else (lines[-1] if lines else "unknown error"))[:500]
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    root = exc
    while stack:
        err = stack.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        root = err
        cause = getattr(err, "cause", None)  # RayTaskError(X) is also an X: use its cause
        if isinstance(cause, BaseException):
            stack.insert(0, cause)
            continue
        if isinstance(err, TrialFailed | AsymVLMError):
            return " ".join(str(err).split())[:500]
        stack += list(getattr(err, "worker_failures", {}).values())
        stack += [e for e in (err.__cause__, err.__context__) if isinstance(e, BaseException)]
    first = (str(root).strip().splitlines() or [""])[0]
    return f"{type(root).__name__}: {first}"[:500]
