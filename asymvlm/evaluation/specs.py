"""The typed spec of each evaluation kind (the config's ``kind``, ``asymvlm analyze <kind>``),
validated by :func:`spec`; no torch here: the CLI builds its flags from them quickly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from asymvlm.config import validate
from asymvlm.errors import ConfigError
from asymvlm.tables import LocationField

PositiveInt = Annotated[int, Field(ge=1)]
Named = Annotated[dict[str, LocationField], Field(min_length=1)]
Aggregation = Literal["mean", "logmeanexp"]
AGGREGATION = (
    "how a likelihood method combines a class's prompts: mean (of the log-likelihoods; "
    "default) or logmeanexp (log of the mean likelihood)"
)


class EvaluationSpec(BaseModel):
    """The base of every kind's spec (frozen once validated); ``title`` says what it is."""

    title: ClassVar[str]
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetrievalSpec(EvaluationSpec):
    title: ClassVar[str] = "cross-modal retrieval with uncertainty (Table 1, Fig. 3)"
    kind: Literal["retrieval"] = Field("retrieval", description="the evaluation")
    data: LocationField = Field(description="the tables to retrieve in")
    levels: PositiveInt | None = Field(10, description="uncertainty bins")
    fold_size: PositiveInt | None = Field(
        None,
        description="also average the metrics over folds of N consecutive images and their "
        "captions (1000 on the COCO 5K test split: COCO 1K)",
    )
    chunk_size: PositiveInt | None = Field(
        None, description="captions scored at once (default: as many as --memory-budget allows)"
    )
    memory_budget: PositiveInt | None = Field(
        None, description="working memory of one chunk of scores (default 512 MiB)"
    )


class ZeroshotSpec(EvaluationSpec):
    title: ClassVar[str] = "zero-shot accuracy after fine-tuning (Table 3)"
    kind: Literal["zeroshot"] = Field("zeroshot", description="the evaluation")
    sets: Named = Field(description="an evaluation set (repeat)")
    fine_tuned_on: str | None = Field(None, description="the training data set's name (report)")
    embedding_model: str | None = Field(None, description="the frozen model's name (report)")
    template_aggregation: Aggregation | None = Field("mean", description=AGGREGATION)


class NotaSpec(EvaluationSpec):
    title: ClassVar[str] = "none-of-the-above prompts (Table 2)"
    kind: Literal["nota"] = Field("nota", description="the evaluation")
    positives: LocationField = Field(description="CIFAR-10-like set whose classes are prompted")
    negatives: LocationField = Field(description="CIFAR-100-like set of unprompted classes")
    far_negatives: LocationField | None = Field(
        None,
        description="images of concepts unrelated to every positive class (the synthetic "
        "world's far negatives)",
    )
    template_aggregation: Aggregation | None = Field("mean", description=AGGREGATION)


class HierarcapsSpec(EvaluationSpec):
    title: ClassVar[str] = "uncertainty along caption hierarchies (Fig. 5)"
    kind: Literal["hierarcaps"] = Field("hierarcaps", description="the evaluation")
    data: LocationField = Field(description="tables with caption levels (HierarCaps, synthetic)")


class OodSpec(EvaluationSpec):
    title: ClassVar[str] = "retrieval under perturbed images and captions (beyond the paper)"
    kind: Literal["ood"] = Field("ood", description="the evaluation")
    data: LocationField = Field(description="the clean tables")
    perturbed: Named = Field(description="a perturbed copy of the data (repeat)")


#: Every evaluation kind's spec, by kind.
SPECS: dict[str, type[EvaluationSpec]] = {
    "retrieval": RetrievalSpec,
    "zeroshot": ZeroshotSpec,
    "nota": NotaSpec,
    "hierarcaps": HierarcapsSpec,
    "ood": OodSpec,
}


def spec(
    kind: str, values: Mapping[str, Any], source: str | None = None, flags: bool = False
) -> EvaluationSpec:
    """The typed spec of evaluation ``kind`` from config keys; a problem is a
    :class:`ConfigError` naming ``source`` and the key (``flags``: spelt as CLI flags)."""
    if kind not in SPECS:
        raise ConfigError(f"unknown evaluation {kind!r}; choose from {sorted(SPECS)}")
    given = {k: v for k, v in values.items() if k != "kind" and v not in (None, {}, [])}
    return validate(
        SPECS[kind], {"kind": kind, **given}, source or f"asymvlm analyze {kind}", flags
    )
