"""The embedding stage: an image-caption data set -> embedding tables, on Ray Data.

The paper caches frozen-encoder embeddings once and trains only on them (App. B.5); this is
that cache. ``run_embed`` reads a data set (:mod:`asymvlm.data.sources`), then streams

    image rows (+ their captions) --(read, decode, preprocess: CPU tasks on GPU clusters,
                                    inside the actor on CPU-only ones)--> pixels (+ captions)
        --(one actor pool, GPU when present: frozen CLIP/SigLIP)--> image and caption rows
                                                                    (unit embeddings + norms)

in a single Ray Data pass (one model load per actor serves both modalities; captions are
encoded in chunks of similar token length), and writes ``ROOT/<split>/{images,texts,errors}``
as described in :mod:`asymvlm.tables`.

Robustness:

* A corrupt, truncated or missing image never stops the job: it becomes a row of
  ``ROOT/<split>/errors/*.parquet`` (kind, id, path, reason), and its captions are left out
  (recorded there too). Empty captions likewise.
* Work is cut into deterministic shards of images (sorted ids); shard k is written as
  ``part-k`` of every folder, each file atomically, and a marker ``_parts/part-k.json`` is
  written last. A re-run skips marked shards and rewrites unmarked ones whole, so an
  interrupted job resumes without duplicates or lost rows, and a finished one
  (``_SUCCESS.json`` with the same fingerprint) is left untouched.
* The job's identity (:meth:`EmbedConfig.fingerprint`: inputs as normalised absolute paths or
  URIs, a hash of the rows read from them, model, precision, perturbations, sampling, shard
  size) is written to ``ROOT/<split>/_JOB.json`` before the first shard. Resuming into an
  output written by another job -- interrupted (``_JOB.json``) or finished (``_SUCCESS.json``)
  -- is refused, naming the fields that differ; so are parts without a job record.
* One writer at a time: the job holds ``ROOT/<split>`` for its whole run
  (:class:`asymvlm.storage.OutputLock`: ``_LOCK`` on local disks, a renewed ``_LEASE.json`` on
  object stores); a second writer is refused with :class:`~asymvlm.errors.LockError`.
  ``ROOT/manifest.json``, shared by the splits, is updated under a short lock of its own.
* Credentials never travel with the job: Ray tasks and actors get no ``runtime_env`` from this
  package (Ray shows it in its dashboard and logs). Workers read storage credentials and
  endpoints (``AWS_*``, ``HF_*`` ...) from their node -- for a local Ray, the environment of the
  process that started it; on a cluster, the instance/pod environment or role.

The job's definition (:class:`asymvlm.data.embed.EmbedConfig`) and the row-level work it runs
(readers, decode, the frozen encoder: :mod:`asymvlm.data.encode`) are plain Python in
``asymvlm/``; this package is the Ray wiring: :mod:`.stage` (``run_embed``, groups of shards),
:mod:`.ray_data` (the Ray Data passes) and :mod:`.shards` (the output's layout, job identity and
manifest). Ray is asked of the entry point's :class:`pipelines.session.RaySession` only when
there is something to embed (a finished job starts nothing).
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
