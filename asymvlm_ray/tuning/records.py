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
    """A frozen record that refuses unknown keys."""

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
    """A Tune trial's config (what :class:`~.staged_search.StagedSearch` suggests): its stage
    and its members, the points it trains (several: as one packed model)."""

    stage: Stage
    members: list[SweepPoint]


@dataclass(frozen=True)
class MemberCheckpoint:
    """Where a finished member's adapter is: Tune's ``checkpoint`` of its trial (member
    ``member``'s folder in it when the trial was a pack of ``pack_size``)."""

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
    """A member that finished: its stage, its validation score (what the lr is chosen by,
    :func:`~.lr_selection.validation_score`), the protocol's results, and, on the driver, where
    its adapter is (never on the wire nor in ``sweep.json``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    stage: Stage
    val_mean_recall_at_1: float
    outcome: dict[str, Any] = Field(description="run_protocol's results: history, val, test")
    adapter: MemberCheckpoint = Field(MemberCheckpoint(None), exclude=True)


class FailedTrial(SweepPoint):
    """A member that failed (diverged, raised, never started): left out of the selection and
    the summary, listed under it with the reason."""

    stage: Stage
    reason: str


class TrialReport(Record):
    """A trial's last report (``tune.report``): per member, its outcome or why it failed (a
    member of a pack that diverged while the others trained on)."""

    outcomes: list[TrialOutcome | FailedTrial]

    @classmethod
    def of(
        cls, result: dict[str, Any] | None, size: int
    ) -> list[TrialOutcome | FailedTrial | None]:
        """Per member of a trial of ``size``, what its Tune ``result`` says (None: the result
        is not the last report, or there is none)."""
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
    """What :func:`~.sweep_driver.run_sweep` returns: the record with the store's URI as given
    and the trials' MLflow runs."""

    child_run_ids: list[str]
