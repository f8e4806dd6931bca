"""One run of the protocol, typed: :class:`RunSpec` (the tables, the splits, the
hyper-parameters, the checkpoint cadence)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from asymvlm import tables
from asymvlm.storage import absolute
from asymvlm.training import TrainConfig

__all__ = ["RunSpec"]


class RunSpec(BaseModel):
    """One run: the embedding tables, the hyper-parameters, the splits (validated once, frozen;
    table roots in one spelling, :func:`asymvlm.storage.absolute`, since workers run elsewhere)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    embeddings: str = Field(description="the embedding tables ROOT (a folder or an s3:// URI)")
    train: TrainConfig = Field(default_factory=TrainConfig, description="the hyper-parameters")
    train_split: str = Field("train", description="split of the tables to train on")
    val_split: str | None = Field(
        "val", description="split to select the learning rate on (none: no validation)"
    )
    test_split: str | None = Field("test", description="split to report (none: no test)")
    val_fraction: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] | None = Field(
        None,
        description="when the tables have no val_split: hold out this share of the training "
        "images (with their captions) for validation -- the same for every worker, seed and "
        "method",
    )
    test_embeddings: str | None = Field(
        None, description="the tables holding test_split, when they are not embeddings"
    )
    checkpoint_every: Annotated[int, Field(ge=1)] | None = Field(
        1,
        description="a checkpoint is due every that many epochs and after the last one (none: "
        "after the last one only)",
    )

    @field_validator("embeddings", "test_embeddings")
    @classmethod
    def _one_spelling(cls, value: str | None) -> str | None:
        return None if value is None else absolute(value)

    def variant(self, *, lr: float, seed: int) -> RunSpec:
        """This run at another ``lr`` and ``seed``."""
        return self.model_copy(
            update={"train": self.train.model_copy(update={"lr": lr, "seed": seed})}
        )

    def holds_out(self) -> bool:
        """Whether ``val_fraction`` of the training images is held out (no ``val_split``)."""
        splits = tables.list_splits(self.embeddings) if self.val_fraction else []
        return bool(self.val_fraction) and self.val_split not in splits

    def checkpoint_due(self, epoch: int) -> bool:
        every = self.checkpoint_every
        return epoch == self.train.epochs or (every is not None and epoch % every == 0)
