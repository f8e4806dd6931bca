"""The Ray layer's configs, validated once into typed objects: sweeps, the whole pipeline, Serve.

Every entry point reads its config here (:func:`load_sweep`, :func:`load_pipeline`,
:func:`load_embed_jobs`, :func:`load_serve`): the YAML, the ``--set`` overrides, ``${VAR}``
from the environment (never a credential) and the validation of **everything** -- every sweep,
every embedding job, every evaluation, every input path -- before Ray or any stage starts, so a
bad value deep in a config fails in seconds as one line naming the file and the key.

Validation is resolution: a validated :class:`SweepConfig` has its output, MLflow store and
table roots filled and absolute, and builds the typed run of each trial
(:meth:`SweepConfig.run_spec`, an :class:`asymvlm.protocol.RunSpec`) without validating or
serialising again; the pipeline fills its sweeps' ``mlflow``, ``storage`` and ``output`` before
they are validated. The science's own schemas are reused, not repeated:
:class:`~asymvlm.training.TrainConfig` (a sweep's training keys),
:class:`~asymvlm.protocol.RunSpec` (its tables and splits),
:class:`~asymvlm.data.embed.EmbedConfig` (embedding jobs), the evaluation registry's specs
(:mod:`asymvlm.evaluation.registry`) and the synthetic world's
:class:`~asymvlm.synthetic.WorldConfig`.

* :mod:`~pipelines.schema.sweep` -- :class:`SweepConfig` and the shared sections;
* :mod:`~pipelines.schema.pipeline` -- :class:`PipelineConfig`;
* :mod:`~pipelines.schema.serve` -- :class:`ServeConfig`;
* :mod:`~pipelines.schema.load` -- the files;
* :mod:`~pipelines.schema.cluster` -- the checks made once Ray is up.
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
