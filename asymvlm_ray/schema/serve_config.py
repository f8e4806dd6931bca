"""Serve's configs: :class:`ServeConfig` (``pipelines/serve.py``, the scorer) and
:class:`SearchConfig` (``pipelines/search.py``, an index and its page)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from asymvlm.config import StrictModel
from asymvlm_ray.schema.sweep_settings import PositiveInt, RaySettings


class _HttpApp(StrictModel):
    """What every Serve application of this project shares: Ray, HTTP, replicas, batching and
    the limits of a request."""

    ray: RaySettings = Field(RaySettings(), description="the Ray session (runtime_env)")
    host: str = Field("127.0.0.1", description="the address Serve's HTTP proxy listens on")
    port: Annotated[int, Field(ge=1, le=65535)] = Field(8000, description="its port")
    route_prefix: str = Field("/", description="the routes' prefix")
    cpus_per_replica: Annotated[float, Field(gt=0)] = Field(1.0, description="CPUs per replica")
    gpus_per_replica: Annotated[float, Field(ge=0)] = Field(0.0, description="GPUs per replica")
    batching: bool = Field(
        True,
        description="dynamic batching: requests that arrive within batch_wait_timeout_s "
        "of each other are embedded together (false: one by one)",
    )
    max_batch_size: PositiveInt = Field(32, description="requests embedded together, at most")
    batch_wait_timeout_s: Annotated[float, Field(ge=0)] = Field(
        0.01, description="how long a request waits for others"
    )
    max_caption_chars: PositiveInt = Field(1000, description="characters per caption, at most")
    max_captions: PositiveInt = Field(1024, description="captions per request, at most")
    max_images: PositiveInt = Field(64, description="images per request, at most")


class ServeConfig(_HttpApp):
    """``pipelines/serve.py``: a scorer (:class:`asymvlm.Scorer`) behind Ray Serve."""

    checkpoint: str = Field(
        description="a checkpoint or model folder, an MLflow model URI (runs:/..., "
        "models:/...) or a Hub model (hf-hub:ORG/REPO[@REVISION])"
    )
    encoder: str | None = Field(None, description="instead of the encoder the checkpoint names")
    tracking_uri: str | None = Field(
        None, description="the MLflow store of a runs:/ or models:/ URI"
    )
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N")
    name: str = Field("asymvlm-scorer", description="the Serve application")
    replicas: PositiveInt = Field(1, description="replicas of the scorer")


class SearchConfig(_HttpApp):
    """``pipelines/search.py``: an index (``asymvlm index``) behind Ray Serve, one replica per
    shard, with its JSON routes, clip-retrieval's ``/knn-service`` and a page at ``/``."""

    index: str = Field(description="an index folder, local or an object-store URI")
    encoder: str | None = Field(None, description="instead of the encoder the index names")
    name: str = Field("asymvlm-search", description="the Serve application")
    k: PositiveInt = Field(10, description="results per query unless a request asks for more")
    batch_wait_timeout_s: Annotated[float, Field(ge=0)] = Field(
        0.002, description="how long a request waits for others (a search is quick)"
    )
    max_k: PositiveInt = Field(1000, description="results a request may ask for, at most")
