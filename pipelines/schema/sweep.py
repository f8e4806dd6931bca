"""A sweep's config: :class:`SweepConfig`, and the sections it shares with the pipeline."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    create_model,
    field_validator,
    model_validator,
)

from asymvlm import config, storage, tracking
from asymvlm.config import StrictModel
from asymvlm.methods import check_method_name
from asymvlm.protocol import RunSpec
from asymvlm.training import TrainConfig

__all__ = [
    "FAULT_ENV",
    "Absolute",
    "FaultInjection",
    "MlflowSettings",
    "PositiveInt",
    "StorageSettings",
    "SweepConfig",
    "default_store",
]

MethodName = Annotated[str, AfterValidator(check_method_name)]
PositiveInt = Annotated[int, Field(ge=1)]
#: A location in one spelling (:func:`asymvlm.storage.absolute`).
Absolute = Annotated[str, AfterValidator(storage.absolute)]
#: The environment variable of a drill (:class:`FaultInjection`) in a submitted job.
FAULT_ENV = "ASYMVLM_FAULT_INJECTION"


# -- shared sections ----------------------------------------------------------------------------
class StorageSettings(StrictModel):
    """Where ``output`` lives: a local folder (one node), an object-store URI, or a mount that
    every node shares (NFS, EFS ...), which must be declared with ``shared_filesystem: true``."""

    shared_filesystem: bool = Field(
        False, description="a local output is a mount every node shares (NFS, EFS ...)"
    )


class MlflowSettings(StrictModel):
    """Where runs are tracked: default a SQLite store beside the outputs."""

    tracking_uri: str | None = Field(
        None,
        description="a tracking server (http(s)://...) or store; default: "
        "sqlite:///<output>/mlflow.db",
    )
    experiment: str | None = Field(None, description="the MLflow experiment")


class FaultInjection(StrictModel):
    """A drill: trial worker ``rank`` SIGKILLs its own process (``kill``) or holds still for
    ``seconds`` (``pause``) right after the checkpoint of ``epoch`` was reported, once per
    ``marker`` file; a submitted job reads it from ``$ASYMVLM_FAULT_INJECTION``
    (``"epoch=2,rank=0,marker=killed.txt"``)."""

    epoch: PositiveInt = Field(description="the epoch after whose checkpoint the worker dies")
    rank: Annotated[int, Field(ge=0)] = Field(0, description="the worker that dies")
    marker: str | None = Field(None, description="a file written first: the drill runs once")
    action: Literal["kill", "pause"] = Field("kill", description="kill the worker, or pause it")
    seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        120.0, description="how long a pause lasts"
    )

    @classmethod
    def from_environment(cls) -> FaultInjection | None:
        raw = os.environ.get(FAULT_ENV)
        if not raw:
            return None
        items = dict(item.split("=", 1) for item in raw.split(",") if "=" in item)
        return config.validate(cls, items, f"${FAULT_ENV}")


def default_store(doc: dict[str, Any], experiment: str) -> None:
    """Fill ``mlflow.experiment`` and ``mlflow.tracking_uri`` (a SQLite store beside ``output``)
    of a document whose ``output`` is known; an object-store output needs a tracking server."""
    mlflow = dict(doc.get("mlflow") or {})
    mlflow["experiment"] = mlflow.get("experiment") or experiment
    output = doc["output"]
    if storage.is_remote(output) and not mlflow.get("tracking_uri"):
        raise ValueError(
            f"output {output} is on an object store, where MLflow's default SQLite store "
            "cannot live: set mlflow.tracking_uri to a tracking server (http(s)://...; its "
            "artifacts may go to the same bucket)"
        )
    if not mlflow.get("tracking_uri"):
        mlflow["tracking_uri"] = tracking.default_tracking_uri(output)
    doc["mlflow"] = mlflow


# -- the sweep ----------------------------------------------------------------------------------
#: The TrainConfig fields a sweep varies per trial (the rest are the sweep's own keys).
SWEPT = ("method", "lr", "seed", "method_kwargs")
_TRAIN_FIELDS = {
    name: (info.annotation, info)
    for name, info in TrainConfig.model_fields.items()
    if name not in SWEPT
}
#: The RunSpec fields a sweep sets for every trial (its tables and splits).
_RUN_FIELDS = {
    name: (info.annotation, info)
    for name, info in RunSpec.model_fields.items()
    if name not in ("train", "embeddings")
}
_RUN_FIELDS["checkpoint_every"] = (
    PositiveInt,
    Field(5, description="a checkpoint every that many epochs and after the last one"),
)


class _SweepBase(StrictModel):
    embeddings: str = RunSpec.model_fields["embeddings"]
    name: str | None = Field(None, description="the sweep's name (required in a pipeline)")
    note: str | None = Field(None, description="a note shown in MLflow and the report")
    methods: Annotated[list[MethodName], Field(min_length=1)] = Field(
        description="methods to sweep (`asymvlm methods` lists them)"
    )
    lr: Annotated[list[Annotated[float, Field(gt=0, allow_inf_nan=False)]], Field(min_length=1)] = (
        Field(description="the learning-rate grid")
    )
    seeds: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] = Field(
        description="the seeds of stage 2 (the first one also runs the lr grid)"
    )
    num_workers: Literal[1] = Field(
        1, description="processes per trial (DDP runs of one config: pipelines/train.py)"
    )
    mlflow: MlflowSettings = Field(
        default_factory=MlflowSettings, description="the tracking store and experiment"
    )
    output: Absolute = Field(description="the sweep's folder (default: runs/<experiment>)")
    storage: StorageSettings = Field(
        default_factory=StorageSettings, description="how the output is shared between nodes"
    )
    max_failures: Annotated[int, Field(ge=0)] = Field(
        1, description="retries of a failed trial (from its last checkpoint)"
    )
    node_wait_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        600.0,
        description="seconds trials may wait for a node (one lost, none with room) "
        "while none runs; then the sweep stops, naming them, and the same command run again "
        "goes on",
    )
    cpus_per_worker: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        1.0, description="CPUs per trial worker"
    )
    gpus_per_worker: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = Field(
        1.0,
        description="GPU share per trial worker when the cluster has GPUs (0.25: four "
        "trials on one GPU)",
    )
    method_kwargs: dict[MethodName, dict[str, Any]] = Field(
        default_factory=dict, description="extra constructor arguments, per method"
    )
    pack: PositiveInt = Field(
        1,
        description="train up to this many trials of one method and stage (other lr and/or "
        "seed) in one process as one batched model, each with its own optimiser, schedule, "
        "metrics and MLflow run",
    )
    fault_injection: FaultInjection | None = Field(
        None, description="a drill: kill a trial's worker once after an epoch (tests)"
    )
    #: The validated base run of each method (:meth:`run_spec` varies its lr and seed).
    _specs: dict[str, RunSpec] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data: Any) -> Any:
        """Experiment ``asymvlm``, output ``runs/<experiment>``, the store beside it."""
        if not isinstance(data, dict):
            return data
        doc = dict(data)
        experiment = (doc.get("mlflow") or {}).get("experiment") or "asymvlm"
        doc["output"] = storage.absolute(doc.get("output") or os.path.join("runs", experiment))
        default_store(doc, experiment)
        return doc

    @field_validator("embeddings", "test_embeddings", check_fields=False)
    @classmethod
    def _one_spelling(cls, value: str | None) -> str | None:
        """Table roots absolute (trials run in their own directories, elsewhere)."""
        return None if value is None else storage.absolute(value)

    @model_validator(mode="after")
    def _consistent(self) -> _SweepBase:
        for field_name in ("lr", "seeds", "methods"):
            values = getattr(self, field_name)
            if len(set(values)) != len(values):
                raise ValueError(f"{field_name} has duplicates: {values}")
        if self.pack > 1 and getattr(self, "stream", "auto") == "always":
            raise ValueError(
                "pack > 1 holds the training split in memory and cannot stream it: "
                "with stream: always, set pack: 1"
            )
        extra = sorted(set(self.method_kwargs) - set(self.methods))
        if extra:
            raise ValueError(f"method_kwargs names methods that are not swept: {extra}")
        # Every method's run, validated once (e.g. no lr=inf): its trials vary lr and seed.
        train = {k: getattr(self, k) for k in _TRAIN_FIELDS}
        run = {k: getattr(self, k) for k in ("embeddings", *_RUN_FIELDS)}
        for method in self.methods:
            cfg = TrainConfig(
                **train,
                method=method,
                lr=self.lr[0],
                seed=self.seeds[0],
                method_kwargs=self.method_kwargs.get(method, {}),
            )
            self._specs[method] = RunSpec(**run, train=cfg)
        return self

    def train_config(self, method: str) -> TrainConfig:
        """``method``'s training config (its lr and seed: the first of the grid)."""
        return self._specs[method].train

    def run_spec(self, method: str, lr: float, seed: int) -> RunSpec:
        """One trial's run: the method's validated base run at ``lr`` and ``seed``."""
        return self._specs[method].variant(lr=lr, seed=seed)

    @property
    def label(self) -> str:
        return self.name or "sweep"


SweepConfig = create_model(  # the RunSpec and TrainConfig fields, with their types and defaults
    "SweepConfig", __base__=_SweepBase, **_RUN_FIELDS, **_TRAIN_FIELDS
)
SweepConfig.__doc__ = """A two-stage Tune sweep (``pipelines/sweep.py``, ``tune_spaces/*.yaml``):
``methods x lr`` with the first seed, the best lr per method on validation, then every seed.
Every :class:`~asymvlm.protocol.RunSpec` field (the tables and splits) and every
:class:`~asymvlm.training.TrainConfig` field but method/lr/seed is a key too."""
