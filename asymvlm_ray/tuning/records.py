"""What crosses the sweep's boundaries, as typed records: a trial's config and its last report
on Tune's wire (plain dicts there, validated here at both ends), each member's outcome or
failure, a method's lr selection, and the sweep's record (``sweep.json``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from ray import tune

from asymvlm.checkpoints import MEMBER_FOLDER

#: ``grid``: a method at each lr of the grid, the first seed; ``seeds``: at its chosen lr.
Stage = Literal["grid", "seeds"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SweepPoint(Record):
    """One training run of the sweep: a method at an lr and a seed."""

    method: str
    lr: float
    seed: int

    def label(self, stage: Stage) -> str:
        """Its trial's ``trial`` tag in MLflow: ``grid-asymvlm-vmf-lr0.002-seed0``."""
        return f"{stage}-{self.method}-lr{float(self.lr)!r}-seed{int(self.seed)}"

    def shown(self) -> str:
        """``asymvlm-vmf lr=0.002 seed=0``."""
        return f"{self.method} lr={self.lr:g} seed={self.seed}"


class TrialConfig(Record):
    """A Tune trial's config: its stage and the points it trains (several: one packed model)."""

    stage: Stage
    members: list[SweepPoint]


@dataclass(frozen=True)
class MemberCheckpoint:
    """Where a member's adapter is: its trial's Tune checkpoint (its folder there in a pack)."""

    checkpoint: tune.Checkpoint | None
    member: int = 0
    pack_size: int = 1

    @contextlib.contextmanager
    def adapter_folder(self) -> Iterator[str | None]:
        """A local folder holding the adapter for the block; None without a checkpoint."""
        if self.checkpoint is None:
            yield None
            return
        with self.checkpoint.as_directory() as directory:
            member = MEMBER_FOLDER.format(k=self.member)
            yield os.path.join(directory, member) if self.pack_size > 1 else directory


class TrialOutcome(SweepPoint):
    """A member that finished: its stage, validation score (what the lr is chosen by), results
    and, on the driver, where its adapter is (not on Tune's wire, not in ``sweep.json``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    stage: Stage
    val_mean_recall_at_1: float
    outcome: dict[str, Any] = Field(description="train_and_evaluate's results: history, val, test")
    adapter: MemberCheckpoint = Field(MemberCheckpoint(None), exclude=True)


class FailedTrial(SweepPoint):
    """A member that failed (diverged, raised, never started), and why."""

    stage: Stage
    reason: str


class TrialReport(Record):
    """A trial's last report (``tune.report``): each member's outcome, or why it failed."""

    outcomes: list[TrialOutcome | FailedTrial]

    @classmethod
    def of(
        cls, result: dict[str, Any] | None, size: int
    ) -> list[TrialOutcome | FailedTrial | None]:
        """What a Tune ``result`` says of each member (None: not the trial's last report)."""
        if not result or "outcomes" not in result:
            return [None] * size
        return list(cls.model_validate({"outcomes": result["outcomes"]}).outcomes)


class LrSelection(Record):
    """A method's lr: the best validation score of its grid (``score`` None: the only lr)."""

    lr: float
    score: float | None
    scores_by_lr: dict[str, float] = Field(description="every finite score, by lr (``%g``)")


class SweepRecord(Record):
    """``sweep.json``, written last (a sweep with it is done): what the evaluations read."""

    parent_run_id: str | None
    experiment: str | None
    tracking_uri: str | None = Field(description="the MLflow store, credentials redacted")
    selection: dict[str, LrSelection]
    summary: dict[str, dict[str, Any]] = Field(description="method -> mean ± std over seeds")
    failed: list[FailedTrial]
    adapters: dict[str, dict[str, str]] = Field(description="method -> seed -> adapter folder")
    markdown: str
    trials: list[TrialOutcome]


class SweepResult(SweepRecord):
    """What ``run_sweep`` returns: the record, the store's URI as given, the trials' runs."""

    child_run_ids: list[str]
