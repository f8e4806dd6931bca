"""A sweep's config: :class:`SweepConfig`, and the sections it shares with the pipeline and
Serve configs (where the output lives, the Ray session, the MLflow store, a drill)."""

from __future__ import annotations

import copy
import logging
import os
import signal
import time
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
from asymvlm.methods import METHODS, check_method_name
from asymvlm.methods.arguments import arguments_model
from asymvlm.runner import RunSpec
from asymvlm.training import TrainConfig
from asymvlm.training.train_config import DEVICE, Count, NonNegativeFloat

logger = logging.getLogger(__name__)

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Finite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
#: A location in one spelling (:func:`asymvlm.storage.absolute`); written relative in a config
#: file, it is relative to the file's folder (:mod:`asymvlm_ray.schema.load`).
Absolute = Annotated[str, AfterValidator(storage.absolute)]
#: The environment variable of a drill (:class:`FaultInjection`) in a submitted job.
FAULT_ENV = "ASYMVLM_FAULT_INJECTION"


class StorageSettings(StrictModel):
    """Where ``output`` lives: a local folder (one node), an object store, or a shared mount."""

    shared_filesystem: bool = Field(False, description="a local output every node mounts")


class RuntimeEnv(StrictModel):
    """The part of Ray's ``runtime_env`` a config may set, e.g. a method plugin for workers."""

    pip: list[str] | None = Field(None, description="pip requirements (a wheel, NAME==VERSION)")
    py_modules: list[Absolute] | None = Field(None, description="local modules or wheels to upload")
    working_dir: Absolute | None = Field(None, description="a local folder each worker starts in")
    env_vars: dict[str, str] | None = Field(None, description="environment variables")


class RaySettings(StrictModel):
    """The Ray session of an entry point (``ray.init``)."""

    address: str | None = Field(
        None,
        description="the cluster to join: its head's HOST:PORT or ray://HOST:PORT (default: "
        "$RAY_ADDRESS; neither: a new local Ray)",
    )
    runtime_env: RuntimeEnv | None = Field(None, description="the job's runtime_env (ray.init)")

    def init_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``ray.init``: the keys set."""
        return self.model_dump(exclude_none=True)


class MlflowSettings(StrictModel):
    """Where runs are tracked: default a SQLite store beside the outputs."""

    tracking_uri: str | None = Field(
        None, description="a tracking server or store; default: sqlite:///<output>/mlflow.db"
    )
    experiment: str | None = Field(None, description="the MLflow experiment")


class FaultInjection(StrictModel):
    """A drill, once per ``marker``: training worker ``rank`` SIGKILLs itself or pauses after
    reporting the checkpoint of ``epoch``, or a curation actor after writing its ``shards``-th
    shard; a job reads ``$ASYMVLM_FAULT_INJECTION`` (``epoch=2``, ``shards=3``)."""

    epoch: PositiveInt | None = Field(None, description="the epoch after whose checkpoint")
    shards: PositiveInt | None = Field(None, description="a curation actor: after this many shards")
    rank: NonNegativeInt = Field(0, description="the worker that dies")
    marker: str | None = Field(None, description="a file written first: the drill runs once")
    action: Literal["kill", "pause"] = Field("kill", description="kill the worker, or pause it")
    seconds: Finite = Field(120.0, description="how long a pause lasts")

    @model_validator(mode="after")
    def _one_moment(self) -> FaultInjection:
        if (self.epoch is None) == (self.shards is None):
            raise ValueError("a drill gives either epoch (training) or shards (curation)")
        return self

    def fire(self, who: str, after: str) -> None:
        """The drill, in this process, unless its marker says it ran: pause, or SIGKILL."""
        if not self.marker or os.path.exists(self.marker):
            return
        with open(self.marker, "w") as fh:
            fh.write(f"{who}: {self.action} after {after}\n")
        if self.action == "pause":
            logger.warning(f"injected pause: {who} holds for {self.seconds:.0f} s after {after}")
            time.sleep(self.seconds)
        else:
            logger.warning(f"injected failure: {who} is killed after {after}")
            os.kill(os.getpid(), signal.SIGKILL)

    @classmethod
    def from_environment(cls) -> FaultInjection | None:
        """The drill ``$ASYMVLM_FAULT_INJECTION`` describes (``epoch=2,rank=1``), if any."""
        raw = os.environ.get(FAULT_ENV)
        if not raw:
            return None
        items = dict(item.split("=", 1) for item in raw.split(",") if "=" in item)
        return config.validate(cls, items, f"${FAULT_ENV}")


def default_store(doc: dict[str, Any], experiment: str) -> None:
    """Fill ``mlflow.experiment`` and ``mlflow.tracking_uri`` (SQLite beside ``output``)."""
    mlflow = {**(doc.get("mlflow") or {})}
    mlflow["experiment"] = mlflow.get("experiment") or experiment
    output = doc["output"]
    if storage.is_remote(output) and not mlflow.get("tracking_uri"):
        raise ValueError(
            f"output {output} is on an object store, where MLflow's default SQLite store "
            "cannot live: set mlflow.tracking_uri to a tracking server (http(s)://...; its "
            "artifacts may go to the same bucket)"
        )
    mlflow["tracking_uri"] = mlflow.get("tracking_uri") or tracking.default_tracking_uri(output)
    doc["mlflow"] = mlflow


MethodName = Annotated[str, AfterValidator(check_method_name)]
#: TrainConfig's fields a sweep sets per trial (method_kwargs: per method, below).
SWEPT = ("method", "lr", "seed", "method_kwargs")


def _unique(values: list) -> list:
    if len(set(values)) != len(values):
        raise ValueError(f"duplicates: {values}")
    return values


def _grid(item: Any) -> Any:
    return Annotated[list[item], Field(min_length=1), AfterValidator(_unique)]


def _as_in(model: type, name: str) -> Any:
    """``model``'s field ``name`` (its default, description and bounds) for the same key here."""
    return copy.copy(model.model_fields[name])


class SweepConfig(StrictModel):
    """A two-stage Tune sweep (``pipelines/sweep.py``, ``tune_spaces/*.yaml``):
    ``methods x lr`` with the first seed, the best lr per method on validation, then every seed.
    Every :class:`~asymvlm.runner.RunSpec` field (the tables and splits) and every
    :class:`~asymvlm.training.TrainConfig` field but method/lr/seed is a key too."""

    # -- the sweep ---------------------------------------------------------------------------
    name: str | None = Field(None, description="the sweep's name (required in a pipeline)")
    note: str | None = Field(None, description="a note shown in MLflow and the report")
    methods: _grid(MethodName) = Field(
        description="methods to sweep (`asymvlm methods`), or `all`: every registered method"
    )
    lr: _grid(Finite) = Field(description="the learning-rate grid")
    seeds: _grid(NonNegativeInt) = Field(description="the seeds of stage 2")
    mlflow: MlflowSettings = Field(MlflowSettings(), description="the tracking store, experiment")
    output: Absolute = Field(description="the sweep's folder (default: runs/<experiment>)")
    storage: StorageSettings = Field(StorageSettings(), description="how nodes share the output")
    ray: RaySettings = Field(RaySettings(), description="the Ray session (runtime_env)")
    max_failures: NonNegativeInt = Field(1, description="retries of a failed trial")
    node_wait_s: Finite = Field(
        600.0, description="seconds trials may wait for a node while none runs; then it stops"
    )
    cpus_per_worker: Finite = Field(1.0, description="CPUs per trial")
    gpus_per_worker: Annotated[Finite, Field(le=1)] = Field(
        1.0, description="GPU share per trial when the cluster has GPUs (0.25: four on one)"
    )
    method_kwargs: dict[MethodName, dict[str, Any]] = Field(
        {}, description="extra constructor arguments, per method"
    )
    pack: PositiveInt = Field(
        1, description="trials of one method and stage trained in one process as one model"
    )
    fault_injection: FaultInjection | None = Field(None, description="a drill (tests)")
    # -- each trial's RunSpec: the tables and splits (the embeddings absolute: trials run elsewhere)
    embeddings: Absolute = _as_in(RunSpec, "embeddings")
    train_split: str = _as_in(RunSpec, "train_split")
    val_split: str | None = _as_in(RunSpec, "val_split")
    test_split: str | None = _as_in(RunSpec, "test_split")
    val_fraction: Annotated[Finite, Field(lt=1)] | None = _as_in(RunSpec, "val_fraction")
    test_embeddings: Absolute | None = _as_in(RunSpec, "test_embeddings")
    checkpoint_every: PositiveInt = Field(5, description="epochs between checkpoints")
    # -- each trial's TrainConfig but the swept method, lr and seed -----------------------------
    protocol: Literal["improved", "official"] = _as_in(TrainConfig, "protocol")
    epochs: Count = _as_in(TrainConfig, "epochs")
    optimizer: Literal["sgd", "adamw"] | None = _as_in(TrainConfig, "optimizer")
    momentum: Annotated[NonNegativeFloat, Field(lt=1)] | None = _as_in(TrainConfig, "momentum")
    weight_decay: NonNegativeFloat | None = _as_in(TrainConfig, "weight_decay")
    batch_size: Count = _as_in(TrainConfig, "batch_size")
    min_lr: NonNegativeFloat = _as_in(TrainConfig, "min_lr")
    hidden_dim: Count | None = _as_in(TrainConfig, "hidden_dim")
    depth: Count | None = _as_in(TrainConfig, "depth")
    adapter_input: Literal["raw", "unit"] = _as_in(TrainConfig, "adapter_input")
    device: Annotated[str, Field(pattern=DEVICE.pattern)] = _as_in(TrainConfig, "device")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = _as_in(TrainConfig, "precision")
    stream: Literal["auto", "always", "never"] = _as_in(TrainConfig, "stream")
    stream_memory_bytes: NonNegativeInt | None = _as_in(TrainConfig, "stream_memory_bytes")
    shuffle_buffer: NonNegativeInt = _as_in(TrainConfig, "shuffle_buffer")
    _specs: dict[str, RunSpec] = PrivateAttr({})  # each method's validated run at lr[0], seeds[0]

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data: Any) -> Any:
        """Default experiment, output and store; ``methods: all``: every registered method."""
        if not isinstance(data, dict):
            return data
        experiment = (data.get("mlflow") or {}).get("experiment") or "asymvlm"
        doc = {**data, "output": data.get("output") or os.path.join("runs", experiment)}
        if doc.get("methods") == "all":
            doc["methods"] = list(METHODS)
        doc["output"] = storage.absolute(doc["output"])
        default_store(doc, experiment)
        return doc

    @field_validator("method_kwargs")
    @classmethod
    def _method_kwargs(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Each method's arguments in its declared types; a bad one named by its key path."""
        each = create_model("method_kwargs", **{m: (arguments_model(m), ...) for m in value})
        return each.model_validate(value).model_dump(exclude_unset=True)

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        """Refuse what cannot run together; each method's run validated once (:meth:`run_spec`)."""
        if self.pack > 1 and self.stream == "always":
            raise ValueError(
                "pack > 1 holds the training split in memory and cannot stream it: "
                "with stream: always, set pack: 1"
            )
        extra = sorted(set(self.method_kwargs) - set(self.methods))
        if extra:
            raise ValueError(f"method_kwargs names methods that are not swept: {extra}")
        train = {k: getattr(self, k) for k in _TRAIN_KEYS if k in self.model_fields_set}
        run = {k: getattr(self, k) for k in _RUN_KEYS}
        for m in self.methods:
            kwargs = self.method_kwargs.get(m, {})
            cfg = TrainConfig(
                **train, method=m, lr=self.lr[0], seed=self.seeds[0], method_kwargs=kwargs
            )
            self._specs[m] = RunSpec(**run, train=cfg)
        return self

    def train_config(self, method: str) -> TrainConfig:
        """``method``'s training config (its lr and seed: the first of the grid)."""
        return self._specs[method].train

    def run_spec(self, method: str, lr: float, seed: int) -> RunSpec:
        """One trial's run: the method's validated base run at ``lr`` and ``seed``."""
        return self._specs[method].variant(lr=lr, seed=seed)

    @property
    def selects_lr(self) -> bool:
        """Several lrs: the grid's trials choose each method's on validation (one: it is used)."""
        return len(self.lr) > 1

    @property
    def label(self) -> str:
        """The sweep's name in messages."""
        return self.name or "sweep"


_TRAIN_KEYS = [k for k in TrainConfig.model_fields if k not in SWEPT]
_RUN_KEYS = [k for k in RunSpec.model_fields if k != "train"]
_MISSING = sorted(set(_TRAIN_KEYS + _RUN_KEYS) - set(SweepConfig.model_fields))
if _MISSING:
    raise TypeError(f"SweepConfig lacks the RunSpec/TrainConfig keys {_MISSING}: add them")
