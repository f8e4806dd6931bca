"""The Ray layer's configs, validated into typed objects (:mod:`~pipelines.schema.load`) first."""

from pipelines.schema.load import check_shared_output as check_shared_output
from pipelines.schema.load import load_embed_jobs as load_embed_jobs
from pipelines.schema.load import load_pipeline as load_pipeline
from pipelines.schema.load import load_serve as load_serve
from pipelines.schema.load import load_sweep as load_sweep
from pipelines.schema.load import sweep_config as sweep_config
from pipelines.schema.pipeline import PipelineConfig as PipelineConfig
from pipelines.schema.pipeline import SyntheticPrepare as SyntheticPrepare
from pipelines.schema.serve import ServeConfig as ServeConfig
from pipelines.schema.sweep import FaultInjection as FaultInjection
from pipelines.schema.sweep import SweepConfig as SweepConfig
