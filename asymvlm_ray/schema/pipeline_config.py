"""The whole pipeline's config: :class:`PipelineConfig` (prepare, embed, sweeps, evaluations)."""

from __future__ import annotations

import difflib
from dataclasses import fields
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from asymvlm import storage
from asymvlm.config import StrictModel
from asymvlm.embedding.embed_config import EmbedConfig
from asymvlm.evaluation.registry import EVALUATIONS
from asymvlm.indexing.settings import IndexSettings
from asymvlm.tables import LocationField
from asymvlm_ray.schema.sweep_settings import (
    Absolute,
    MlflowSettings,
    PositiveInt,
    RaySettings,
    StorageSettings,
    SweepConfig,
    default_store,
)


# -- evaluations --------------------------------------------------------------------------------
class _EvaluationItem(StrictModel):
    """What the pipeline adds to an evaluation's spec: whose adapters it evaluates."""

    sweep: str | None = Field(None, description="the sweep whose seed adapters are evaluated")
    frozen: bool = Field(False, description="also the frozen model (clip)")
    dim: PositiveInt | None = Field(None, description="the width of a frozen-only evaluation")
    note: str | None = Field(None, description="a note shown in MLflow and the report")


#: One pipeline evaluation per kind of the registry: the kind's spec plus the pipeline's keys.
EVALUATION_ITEMS = {
    kind: create_model(
        f"{ev.spec_model.__name__.removesuffix('Spec')}Evaluation",
        __base__=(ev.spec_model, _EvaluationItem),
    )
    for kind, ev in EVALUATIONS.items()
}
Evaluation = Annotated[
    Union[tuple(EVALUATION_ITEMS.values())],  # noqa: UP007 - a union of the registry's kinds
    Field(discriminator="kind"),
]


# -- indexes ------------------------------------------------------------------------------------
class IndexItem(IndexSettings):
    """An item of ``indexes``: a sweep's adapter over a split of tables, as ``asymvlm index``
    builds it (docs/search.md), into ``OUTPUT/indexes/<name>`` unless ``output`` says."""

    name: str = Field(description="the index's name")
    data: LocationField = Field(description="the tables and split to index (ROOT:SPLIT)")
    sweep: str = Field(description="the sweep whose adapter is indexed")
    method: str = Field("asymvlm-vmf", description="the sweep's method whose adapter is indexed")
    seed: int = Field(0, description="its seed")
    output: Absolute | None = Field(None, description="the index folder")


# -- prepare ------------------------------------------------------------------------------------
class SyntheticClasses(StrictModel):
    """``prepare.synthetic.classes``: a :class:`asymvlm.synthetic.ClassificationSpec`."""

    level: Annotated[int, Field(ge=0)] = Field(1, description="the concept level of the classes")
    n_classes: PositiveInt | None = Field(None, description="classes per set (default: all)")
    positives: PositiveInt = Field(1000, description="images of the positive set")
    negatives: PositiveInt = Field(1000, description="images of the negative set")
    zeroshot: PositiveInt = Field(1000, description="images of the zero-shot domain's set")
    templates: Annotated[tuple[str, ...], Field(min_length=1)] | None = Field(
        None, description="prompt templates with {} for the class name (default: the world's)"
    )


class SyntheticPrepare(StrictModel):
    """``prepare.synthetic``: the synthetic world's output, a preset and the
    :class:`~asymvlm.synthetic.WorldConfig` knobs that override it."""

    model_config = ConfigDict(extra="allow")
    output: Absolute = Field(description="the world's table root")
    preset: Literal["demo", "coco"] | None = Field(
        None, description="a named world; any WorldConfig knob given beside it overrides it"
    )
    train_images: PositiveInt | None = Field(None, description="images of the train split")
    val_images: Annotated[int, Field(ge=0)] | None = Field(None, description="0: no val split")
    test_images: Annotated[int, Field(ge=0)] | None = Field(None, description="0: no test split")
    classes: SyntheticClasses | None = Field(
        None, description="true (every default) or its keys: also write the classification sets"
    )

    @field_validator("classes", mode="before")
    @classmethod
    def _classes_flag(cls, value: Any) -> Any:
        return {} if value is True else None if value is False else value

    @model_validator(mode="after")
    def _world_keys(self) -> SyntheticPrepare:
        from asymvlm.synthetic import WorldConfig

        known = [f.name for f in fields(WorldConfig) if f.name != "splits"]
        for key in set(self.model_extra or {}) - set(known):
            hint = difflib.get_close_matches(key, known + list(type(self).model_fields), 1)
            raise ValueError(
                f"unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
            )
        self.world_config()  # every knob's value is checked here, not when the stage runs
        return self

    def world_config(self) -> Any:
        """The :class:`~asymvlm.synthetic.WorldConfig` this section describes."""
        from asymvlm.synthetic import WorldConfig

        sizes = {split: getattr(self, f"{split}_images") for split in ("train", "val", "test")}
        try:
            return WorldConfig.preset(self.preset, sizes, **(self.model_extra or {}))
        except (TypeError, ValueError) as err:  # a knob's value out of range or of a bad type
            raise ValueError(f"world knobs: {err}") from None

    def classification_spec(self) -> Any:
        """The :class:`~asymvlm.synthetic.ClassificationSpec` of ``classes`` (None: no sets)."""
        from asymvlm.synthetic import ClassificationSpec

        return self.classes and ClassificationSpec(**self.classes.model_dump(exclude_none=True))

    def class_set_roots(self) -> dict[str, str]:
        """Role -> table root of the classification sets this section writes (``{}``: none)."""
        from asymvlm.synthetic import classification_roles

        spec = self.classification_spec()
        roles = classification_roles(self.world_config(), spec) if spec else ()
        return {role: f"{self.output.rstrip('/')}-{role}" for role in roles}


class HierarCapsCifarPrepare(StrictModel):
    """``prepare.hierarcaps_cifar``: a small classification set cut from HierarCaps images."""

    hierarcaps: Absolute = Field(description="the HierarCaps folder (csv and images)")
    output: Absolute = Field(description="the folder the set's images and annotations go to")
    n_classes: Annotated[int, Field(ge=2)] = Field(5, description="classes of the set")


class PrepareConfig(StrictModel):
    """Offline stand-ins written before the embedding stage."""

    tiny_clip: Absolute | None = Field(None, description="write a tiny random CLIP here")
    synthetic: SyntheticPrepare | None = Field(None, description="write a synthetic world")
    hierarcaps_cifar: HierarCapsCifarPrepare | None = Field(
        None, description="write a classification set from HierarCaps images"
    )


# -- embed, report, the pipeline ----------------------------------------------------------------
class EmbedSection(StrictModel):
    """``embed``: ``defaults`` merged into each of the ``jobs`` (an ``EmbedConfig`` each)."""

    defaults: dict[str, Any] = Field({}, description="keys every job takes unless it sets them")
    jobs: list[EmbedConfig] = Field([], description="the embedding jobs")

    @model_validator(mode="before")
    @classmethod
    def _with_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(jobs := data.get("jobs") or [], list):
            return data
        defaults = data.get("defaults") or {}
        return {**data, "jobs": [{**defaults, **j} if isinstance(j, dict) else j for j in jobs]}


class ReportConfig(StrictModel):
    """``report``: where the report goes."""

    output: Absolute | None = Field(
        None, description="the report's folder (default: OUTPUT/report)"
    )


class PipelineConfig(StrictModel):
    """``pipelines/full.py``: prepare -> embed -> sweep -> evaluate -> report; every sweep with
    the pipeline's MLflow store and storage, and the output ``<output>/sweeps/<name>``."""

    name: str = Field(description="the pipeline's name (MLflow experiment asymvlm-<name>)")
    output: Absolute = Field(description="everything lands below it; ${output} in any value")
    storage: StorageSettings = Field(StorageSettings(), description="how nodes share the output")
    mlflow: MlflowSettings = Field(MlflowSettings(), description="the tracking store, experiment")
    ray: RaySettings = Field(RaySettings(), description="the Ray session (runtime_env)")
    prepare: PrepareConfig = Field(PrepareConfig(), description="offline stand-ins written first")
    embed: EmbedSection = Field(EmbedSection(), description="the embedding stage's jobs")
    sweeps: list[SweepConfig] = Field([], description="the Tune sweeps (each needs a name)")  # type: ignore[valid-type]
    evaluations: list[Evaluation] = Field([], description="the paper's evaluations, by kind")  # type: ignore[valid-type]
    indexes: list[IndexItem] = Field([], description="search indexes of the sweeps' adapters")
    report: ReportConfig = Field(ReportConfig(), description="the report")

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data: Any) -> Any:
        """The store; each sweep's MLflow, storage, Ray session and output from the pipeline's."""
        if not isinstance(data, dict) or "output" not in data or "name" not in data:
            return data
        doc = {**data, "output": storage.absolute(data["output"])}
        default_store(doc, f"asymvlm-{doc['name']}")
        shared = {key: doc.get(key) or {} for key in ("mlflow", "storage", "ray")}
        doc["sweeps"] = sweeps = list(doc.get("sweeps") or [])
        for i, sweep in enumerate(sweeps):
            if isinstance(sweep, dict):
                if not sweep.get("name"):
                    raise ValueError(f"sweeps[{i}] needs a name")
                where = storage.uri_join(doc["output"], "sweeps", sweep["name"])
                sweeps[i] = {**sweep, **shared, "output": sweep.get("output") or where}
        doc["indexes"] = indexes = list(doc.get("indexes") or [])
        for i, item in enumerate(indexes):
            if isinstance(item, dict) and item.get("name") and not item.get("output"):
                where = storage.uri_join(doc["output"], "indexes", item["name"])
                indexes[i] = {**item, "output": where}
        return doc

    @model_validator(mode="after")
    def _references(self) -> PipelineConfig:
        names = [s.name for s in self.sweeps]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"every sweep needs a unique name; repeated: {dupes}")
        for i, ev in enumerate(self.evaluations):
            if ev.sweep and ev.sweep not in names:
                raise ValueError(f"evaluations[{i}] names unknown sweep {ev.sweep!r}")
            if ev.frozen and not ev.sweep and ev.dim is None:
                raise ValueError(f"evaluations[{i}]: a frozen-only evaluation needs dim")
        for i, item in enumerate(self.indexes):
            if item.sweep not in names:
                raise ValueError(f"indexes[{i}] names unknown sweep {item.sweep!r}")
            if item.method not in self.sweep(item.sweep).methods:
                raise ValueError(f"indexes[{i}]: sweep {item.sweep!r} trains no {item.method!r}")
        for key in ("tiny_clip", "hierarcaps_cifar"):
            where = getattr(self.prepare, key)
            if (where := getattr(where, "output", where)) and storage.is_remote(where):
                raise ValueError(
                    f"prepare.{key} writes local files; give it a local folder, not {where}"
                )
        return self

    def sweep(self, name: str) -> Any:
        """The sweep called ``name``."""
        return next(s for s in self.sweeps if s.name == name)
