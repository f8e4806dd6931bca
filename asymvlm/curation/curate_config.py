"""One curation job: :class:`CurateConfig` (the CLI flags / the YAML keys) and its
:class:`SelectionRule` s, validated on construction."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass

from asymvlm.errors import ConfigError

PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
NonEmpty = Annotated[str, Field(min_length=1)]
FORMATS = ("auto", "img2dataset", "webdataset", "clip-retrieval", "datacomp", "tables")


@dataclass(config=ConfigDict(extra="forbid"))
class SelectionRule:
    """Which pairs to keep: every condition given must hold (at least one). ``most_specific``
    and ``clip_top`` are fractions of the scored pool (by κ, by CLIP score), the others
    thresholds."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the file names")
    kappa_min: Finite | None = Field(None, description="keep κ >= this")
    most_specific: Fraction | None = Field(None, description="keep this fraction, highest κ")
    clip_min: Finite | None = Field(None, description="keep CLIP score >= this")
    clip_top: Fraction | None = Field(None, description="keep this fraction, highest CLIP score")

    @model_validator(mode="after")
    def _some_condition(self) -> SelectionRule:
        if not (self.uses_kappa or self.uses_clip):
            raise ValueError(
                f"rule {self.name!r} has no condition: give kappa_min, most_specific, "
                "clip_min or clip_top"
            )
        return self

    @property
    def uses_kappa(self) -> bool:
        return self.kappa_min is not None or self.most_specific is not None

    @property
    def uses_clip(self) -> bool:
        return self.clip_min is not None or self.clip_top is not None


def default_rules() -> list[SelectionRule]:
    """Without rules: drop the most vague 30 % of the captions."""
    return [SelectionRule(name="specific-70", most_specific=0.7)]


def parse_rule(text: str) -> SelectionRule:
    """``NAME:KEY=VALUE[,KEY=VALUE]`` (``--rule specific-70:most_specific=0.7``)."""
    match = re.fullmatch(r"([^:]+):(.+)", text.strip())
    if not match:
        raise ConfigError(f"--rule {text!r}: write NAME:KEY=VALUE[,KEY=VALUE]")
    fields: dict[str, str] = {"name": match[1]}
    for item in match[2].split(","):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--rule {text!r}: {item!r} is not KEY=VALUE")
        fields[key.strip()] = value.strip()
    return SelectionRule(**fields)  # type: ignore[arg-type]


@dataclass(config=ConfigDict(extra="forbid"))
class CurateConfig:
    """One curation job, validated on construction; the pool is read when the job starts."""

    pool: NonEmpty = Field(description="the pool's folder (or s3://...)")
    checkpoint: NonEmpty = Field(
        description="the adapter: folder, s3://, runs:/, models:/ or hf-hub:"
    )
    output: NonEmpty = Field(description="the output folder (or s3://...)")
    format: Literal[FORMATS] = Field("auto", description="the pool's format (auto: detected)")
    split: str = Field("train", description="tables: the split to score")
    encoder: str | None = Field(
        None, description="the encoder of captions to embed (default: the checkpoint's)"
    )
    features: Literal["auto", "b32", "l14"] = Field(
        "auto", description="DataComp .npz features (auto: the adapter's dimension)"
    )
    write_mu: bool = Field(False, description="write each caption's mu too")
    # 2048: an actor's peak memory stays flat shard after shard (benchmarks/README.md)
    rows_per_batch: PositiveInt = Field(2048, description="rows through the adapter at once")
    num_actors: PositiveInt = Field(1, description="scoring actors (one GPU each on GPUs)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: a GPU if any")
    tracking_uri: str | None = Field(None, description="the MLflow store the job is logged to")
    experiment: str = Field("curate", description="the MLflow experiment")
    rules: list[SelectionRule] = Field(
        default_factory=default_rules, description="the selections to write"
    )

    @model_validator(mode="after")
    def _unique_rule_names(self) -> CurateConfig:
        names = [rule.name for rule in self.rules]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"rule names must differ: {', '.join(twice)} given twice")
        return self
