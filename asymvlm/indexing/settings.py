"""How an index is built (:class:`IndexSettings`): the one schema of ``asymvlm index``, the
Python API and the pipeline's ``index`` stage; torch-free, so ``--help`` loads nothing heavy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asymvlm.config import StrictModel


class IndexSettings(StrictModel):
    """The index kinds, the memory budget and the decisions' target."""

    kind: Literal["auto", "flat", "hnsw", "ivf", "ivfpq"] = Field(
        "auto",
        description="auto: exact up to 100k vectors, HNSW up to 250k, IVF beyond, IVF-PQ where "
        "the memory budget holds no full vectors",
    )
    memory_gib: float | None = Field(
        None, gt=0, description="memory budget of the two indexes together (GiB; default: none)"
    )
    validation: str | None = Field(
        "val", description="split the decisions are fitted on (none there: no decisions)"
    )
    target_risk: float = Field(
        0.5, gt=0, lt=1, description="the highest share of wrong first results among answers given"
    )
    widen_max: int = Field(100, ge=1, description="results of a widened answer at most")
    shards: int = Field(
        1, ge=1, description="shards of contiguous rows (Ray Serve: one replica each)"
    )
