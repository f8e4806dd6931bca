"""The Ray layer's configs, validated once into typed objects before Ray or any stage starts:
sweeps (:mod:`~pipelines.schema.sweep`), the whole pipeline (:mod:`~pipelines.schema.pipeline`),
Serve (:mod:`~pipelines.schema.serve`), read by :mod:`~pipelines.schema.load`. The science's
schemas are reused, not repeated (``TrainConfig``, ``RunSpec``, ``EmbedConfig``, ...)."""

from pipelines.schema.load import (
    check_shared_output,
    load_embed_jobs,
    load_pipeline,
    load_serve,
    load_sweep,
    sweep_config,
)
from pipelines.schema.pipeline import PipelineConfig, SyntheticPrepare
from pipelines.schema.serve import ServeConfig
from pipelines.schema.sweep import FaultInjection, StorageSettings, SweepConfig

__all__ = [
    "FaultInjection",
    "PipelineConfig",
    "ServeConfig",
    "StorageSettings",
    "SweepConfig",
    "SyntheticPrepare",
    "check_shared_output",
    "load_embed_jobs",
    "load_pipeline",
    "load_serve",
    "load_sweep",
    "sweep_config",
]
