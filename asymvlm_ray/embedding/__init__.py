"""The embedding stage on Ray Data: a data set -> embedding tables (App. B.5: frozen-encoder
embeddings cached once); resumable shards and job identity as in docs/data.md."""

from asymvlm_ray.embedding.shards import JOB, SUCCESS
from asymvlm_ray.embedding.stage import run_embed

__all__ = ["JOB", "SUCCESS", "run_embed"]
