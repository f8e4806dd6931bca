"""The embedding stage on Ray Data: a data set -> embedding tables (App. B.5: frozen-encoder
embeddings cached once); resumable shards and job identity as in docs/data.md.
"""

from __future__ import annotations

from pipelines.embedding.shards import (
    ERROR_SCHEMA,
    ERRORS_DIR,
    JOB,
    PARTS_DIR,
    PROMPTS_DIR,
    SUCCESS,
)
from pipelines.embedding.stage import run_embed

__all__ = ["ERRORS_DIR", "ERROR_SCHEMA", "JOB", "PARTS_DIR", "PROMPTS_DIR", "SUCCESS", "run_embed"]
