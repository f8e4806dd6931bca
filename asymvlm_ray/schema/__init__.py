"""The Ray layer's configs, validated into typed objects (:mod:`~asymvlm_ray.schema.load`) first."""

from asymvlm_ray.schema.load import check_shared_output as check_shared_output
from asymvlm_ray.schema.load import load_curate as load_curate
from asymvlm_ray.schema.load import load_embed_jobs as load_embed_jobs
from asymvlm_ray.schema.load import load_pipeline as load_pipeline
from asymvlm_ray.schema.load import load_search as load_search
from asymvlm_ray.schema.load import load_serve as load_serve
from asymvlm_ray.schema.load import load_sweep as load_sweep
from asymvlm_ray.schema.load import sweep_config as sweep_config
from asymvlm_ray.schema.pipeline_config import PipelineConfig as PipelineConfig
from asymvlm_ray.schema.pipeline_config import SyntheticPrepare as SyntheticPrepare
from asymvlm_ray.schema.serve_config import SearchConfig as SearchConfig
from asymvlm_ray.schema.serve_config import ServeConfig as ServeConfig
from asymvlm_ray.schema.sweep_settings import FaultInjection as FaultInjection
from asymvlm_ray.schema.sweep_settings import SweepConfig as SweepConfig
