"""A sweep's journal in ``<output>/journal/`` (shared storage): the sweep's MLflow run and, per
trial, its run spec, latest checkpoint and final row. A rerun of the same command reads back
the trials that finished and resumes the others from their checkpoints; records of another
config are left out, with a warning.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ray import tune

from asymvlm import storage
from asymvlm.checkpoints import MEMBER_FOLDER
from pipelines.schema import SweepConfig
from pipelines.tuning.trials import SELECTION_METRIC

__all__ = [
    "JOURNAL_DIR",
    "Journal",
    "Previous",
    "TrialJournal",
    "TrialRecord",
    "restored_key",
    "trial_label",
]

logger = logging.getLogger("pipelines.sweep")

JOURNAL_DIR = "journal"
_RUN = "run.json"
_TRIALS = "trials"


def trial_label(stage: str, trial: dict[str, Any]) -> str:
    """A trial's name in the journal (and the ``trial`` tag of its MLflow run):
    ``grid-asymvlm-vmf-lr0.002-seed0``."""
    return f"{stage}-{trial['method']}-lr{float(trial['lr'])!r}-seed{int(trial['seed'])}"


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """What the journal holds of one trial."""

    label: str
    stage: str
    trial: dict[str, Any]
    #: The trial's latest checkpoint (a folder URI), and the folder of this trial in it (a
    #: packed trial's checkpoint holds one per member).
    checkpoint: str | None = None
    member_dir: str = ""
    #: The epoch of that checkpoint.
    epoch: int = 0
    #: The labels of the pack the checkpoint is of (None: a trial of its own).
    pack: list[str] | None = None
    #: The final row (selection score and outcome) of a finished trial.
    final: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.final is not None and "outcome" in self.final


class Journal:
    """The journal of ``sweep`` (its folder ``<output>/journal``)."""

    def __init__(self, sweep: SweepConfig) -> None:
        self.sweep = sweep
        self.root = storage.uri_join(sweep.output, JOURNAL_DIR)
        self._written: dict[str, dict[str, Any]] = {}  # label -> its record, as last written

    def _spec(self, trial: dict[str, Any]) -> dict[str, Any]:
        run = self.sweep.run_spec(trial["method"], trial["lr"], trial["seed"])
        return run.model_dump(mode="json")

    # -- the sweep's MLflow run -------------------------------------------------------------
    def run_id(self) -> str | None:
        """The MLflow run of the sweep's last attempt, if one was recorded."""
        record = storage.read_json(self.root, _RUN)
        return None if record is None else record.get("run_id")

    def set_run_id(self, run_id: str) -> None:
        storage.write_json(self.root, _RUN, {"run_id": run_id})

    # -- trials -------------------------------------------------------------------------------
    def record(self, stage: str, trial: dict[str, Any], **fields: Any) -> None:
        """Write the trial's record: ``fields`` of :class:`TrialRecord` over what it held."""
        label = trial_label(stage, trial)
        where = f"{_TRIALS}/{label}.json"
        if label not in self._written:
            self._written[label] = storage.read_json(self.root, where) or {}
        old = self._written[label]
        spec = self._spec(trial)
        if old.get("spec") != spec:  # a record of another run: replaced, not merged
            old = {}
        payload = {**old, "label": label, "stage": stage, "trial": trial, "spec": spec, **fields}
        storage.write_json(self.root, where, payload)
        self._written[label] = payload

    def previous(self) -> Previous:
        """Every trial recorded for exactly the run the sweep would train now (others are left
        out, with a warning)."""
        folder = storage.uri_join(self.root, _TRIALS)
        out: dict[str, TrialRecord] = {}
        stale = []
        for name in storage.list_names(folder):
            if not name.endswith(".json"):
                continue
            raw = storage.read_json(folder, name)
            if not raw or raw.get("trial", {}).get("method") not in self.sweep.methods:
                continue
            if raw.get("spec") != self._spec(raw["trial"]):
                stale.append(raw["label"])
                continue
            fields = {f.name for f in dataclasses.fields(TrialRecord)}
            out[raw["label"]] = TrialRecord(**{k: v for k, v in raw.items() if k in fields})
        if stale:
            logger.warning(
                "sweep %s: %d trial record(s) of another config are not reused (%s)",
                self.sweep.label,
                len(stale),
                ", ".join(stale[:5]),
            )
        return Previous(out)


class Previous:
    """What an earlier run of the sweep left: its trial records (label -> record)."""

    def __init__(self, records: dict[str, TrialRecord]) -> None:
        self.records = records

    def get(self, stage: str, trial: dict[str, Any]) -> TrialRecord | None:
        return self.records.get(trial_label(stage, trial))

    def finished(self, stage: str, trial: dict[str, Any]) -> bool:
        record = self.get(stage, trial)
        return record is not None and record.finished

    def resume(self, stage: str, members: list[dict[str, Any]]) -> str | None:
        """The checkpoint the trial ``members`` (one, or a pack) goes on from: the latest one
        it left, when it was the same trial (a pack of the same members); else None."""
        labels = [trial_label(stage, t) for t in members]
        records = [self.records.get(label) for label in labels]
        if any(r is None or r.finished or not r.checkpoint for r in records):
            return None
        first = records[0]
        assert first is not None
        same = (
            (first.pack is None)
            if len(labels) == 1
            else all(
                r is not None and r.pack == labels and r.checkpoint == first.checkpoint
                for r in records
            )
        )
        return first.checkpoint if same else None

    def counts(self) -> tuple[int, int]:
        """(finished trials, trials with a checkpoint to go on from)."""
        done = sum(r.finished for r in self.records.values())
        return done, sum(bool(r.checkpoint) and not r.finished for r in self.records.values())


class TrialJournal(tune.Callback):
    """Tune callback on the driver: each trial's latest checkpoint as it is reported, and its
    final row when it finishes, into the :class:`Journal` (a packed trial: each member's)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    @staticmethod
    def _members(config: dict[str, Any]) -> list[dict[str, Any]]:
        return list(config.get("pack") or [config["trial"]])

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        uri = storage.uri_of(checkpoint.filesystem, checkpoint.path)
        members = self._members(trial.config)
        stage = trial.config["stage"]
        epoch = int((trial.last_result or {}).get("epoch", 0))
        pack = [trial_label(stage, t) for t in members] if len(members) > 1 else None
        for k, member in enumerate(members):
            folder = "" if pack is None else MEMBER_FOLDER.format(k=k)
            self.journal.record(
                stage, member, checkpoint=uri, member_dir=folder, epoch=epoch, pack=pack
            )

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        members = self._members(trial.config)
        rows = result.get("pack_outcomes") or ([result] if "outcome" in result else [])
        if not rows:
            return
        checkpoint = getattr(trial, "checkpoint", None)
        uri = storage.uri_of(checkpoint.filesystem, checkpoint.path) if checkpoint else None
        for k, (member, row) in enumerate(zip(members, rows, strict=True)):
            if "outcome" not in row:  # a member of a pack that diverged
                continue
            folder = "" if len(members) == 1 else MEMBER_FOLDER.format(k=k)
            final = {
                key: row[key]
                for key in (SELECTION_METRIC, "method", "lr", "seed", "stage", "outcome")
                if key in row
            }
            self.journal.record(
                trial.config["stage"], member, final=final, checkpoint=uri, member_dir=folder
            )


def restored_key(label: str) -> str:
    """The key (as Tune trial ids are) of a trial read back from the journal."""
    return f"journal:{label}"
