"""The Ray layer's configs, validated once into typed objects before Ray or any stage starts:
sweeps (:mod:`~pipelines.schema.sweep`), the whole pipeline (:mod:`~pipelines.schema.pipeline`),
Serve (:mod:`~pipelines.schema.serve`), read by :mod:`~pipelines.schema.load`; the checks made
once Ray is up in :mod:`~pipelines.schema.cluster`. The science's schemas are reused, not
repeated (``TrainConfig``, ``RunSpec``, ``EmbedConfig``, the evaluation registry's specs,
``WorldConfig``).
"""

from pipelines.schema.cluster import check_shared_output
from pipelines.schema.load import (
    check_inputs,
    load_embed_jobs,
    load_pipeline,
    load_serve,
    load_sweep,
    sweep_config,
)
from pipelines.schema.pipeline import (
    EVALUATION_ITEMS,
    OPTIONAL_DATA,
    EmbedSection,
    PipelineConfig,
    SyntheticPrepare,
    drop_unavailable,
    required_data,
)
from pipelines.schema.serve import ServeConfig
from pipelines.schema.sweep import (
    FAULT_ENV,
    FaultInjection,
    MlflowSettings,
    StorageSettings,
    SweepConfig,
)

__all__ = [
    "EVALUATION_ITEMS",
    "FAULT_ENV",
    "OPTIONAL_DATA",
    "EmbedSection",
    "FaultInjection",
    "MlflowSettings",
    "PipelineConfig",
    "ServeConfig",
    "StorageSettings",
    "SweepConfig",
    "SyntheticPrepare",
    "check_inputs",
    "check_shared_output",
    "drop_unavailable",
    "load_embed_jobs",
    "load_pipeline",
    "load_serve",
    "load_sweep",
    "required_data",
    "sweep_config",
]
