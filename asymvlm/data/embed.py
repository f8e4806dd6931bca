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
  (:class:`asymvlm.tables.OutputLock`: ``_LOCK`` on local disks, a renewed ``_LEASE.json`` on
  object stores); a second writer is refused with :class:`~asymvlm.errors.LockError`.
  ``ROOT/manifest.json``, shared by the splits, is updated under a short lock of its own.
* Credentials never travel with the job: Ray tasks and actors get no ``runtime_env`` from this
  module (Ray shows it in its dashboard and logs). Workers read storage credentials and
  endpoints (``AWS_*``, ``HF_*`` ...) from their node -- for a local Ray, the environment of the
  process that started it; on a cluster, the instance/pod environment or role.

Ray wiring lives here rather than in ``pipelines/`` because the ``asymvlm embed`` command is
this stage; the pieces it runs (readers, the encoder) are plain Python.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import socket
import sys
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from asymvlm import storage, tables
from asymvlm.data.encode import (  # noqa: F401 - row-level work, importable from here too
    DecodeEncodeActor,
    EncoderActor,
    TextEncoderActor,
    _perturb_captions,
    decode_batch,
    encode_texts_by_length,
)
from asymvlm.data.sources import READERS, SourceData, read_source
from asymvlm.errors import ConfigError

SUCCESS = "_SUCCESS.json"
JOB = "_JOB.json"
PARTS_DIR = "_parts"
ERRORS_DIR = "errors"
PROMPTS_DIR = "prompts"
_SOURCE_IMAGE_COLUMNS = frozenset({"image_id", "path", "offset", "length", "data", "shard"})
DUMMY_PROMPTS = ("a photo", "a photo of an object", "a photo of something")
ERROR_SCHEMA = pa.schema(
    [("kind", pa.string()), ("id", pa.string()), ("path", pa.string()), ("reason", pa.string())]
)


#: Encoder precisions (``asymvlm.data.encoder`` accepts these names, case-insensitively).
DTYPES = ("auto", "fp32", "float32", "fp16", "float16", "half", "bf16", "bfloat16")
_DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
#: Keys of the fingerprint that are locations (compared in normalised form).
_PATH_KEYS = ("model", "annotations", "images", "id_list")
FINGERPRINT_VERSION = 2
PositiveInt = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonEmpty = Annotated[str, Field(min_length=1)]


@dataclass(config=ConfigDict(extra="forbid"))
class EmbedConfig:
    """Everything that defines one embedding job (the CLI flags / the YAML keys).

    Validated on construction (pydantic): unknown keys, wrong types and out-of-range values raise
    :class:`pydantic.ValidationError` naming the key. Input paths are checked separately, by
    :meth:`check_inputs` at the start of :func:`run_embed` (a pipeline may create them later).
    """

    dataset: str
    model: NonEmpty
    split: NonEmpty
    output: NonEmpty
    annotations: str | None = None
    images: str | None = None
    batch_size: PositiveInt = 64
    num_actors: PositiveInt = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: str = "auto"
    sample: PositiveInt | None = None
    seed: NonNegativeInt = 0
    id_list: str | None = None
    shard_size: PositiveInt = 2048
    shards_per_round: PositiveInt = 8
    decode_cpus: PositiveFloat = 1.0
    actor_cpus: PositiveFloat = 1.0
    #: Where images are decoded: "tasks" (CPU tasks streaming into the encoder actors, for GPU
    #: clusters), "actor" (inside the encoder actor, best on CPU-only machines) or "auto".
    decode_in: Literal["auto", "tasks", "actor"] = "auto"
    #: OOD robustness: perturb images / captions before embedding ("kind:severity", see
    #: :mod:`asymvlm.data.perturb`), seeded per item by ``perturbation_seed`` and its id.
    #: Classification sets: prompts embedded beside the class prompts as class_index -1, the
    #: "none-of-the-above" candidates of Table 2.
    dummy_prompts: tuple[str, ...] = DUMMY_PROMPTS
    image_perturbation: str | None = None
    text_perturbation: str | None = None
    perturbation_seed: NonNegativeInt = 0

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        if value not in READERS:
            raise ValueError(f"unknown data set {value!r}; known: {', '.join(sorted(READERS))}")
        return value

    @field_validator("split")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        if "/" in value or "\\" in value or value.startswith((".", "_")):
            raise ValueError(
                f"split {value!r} names a folder under the output: no '/', no leading '.' or '_'"
            )
        return value

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value.lower() not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {value!r}")
        return _DTYPE_ALIASES.get(value.lower(), value.lower())

    @field_validator("image_perturbation", "text_perturbation")
    @classmethod
    def _perturbation(cls, value: str | None, info: ValidationInfo) -> str | None:
        from asymvlm.data import perturb

        kinds = (perturb.IMAGE_PERTURBATIONS if info.field_name == "image_perturbation"
                 else perturb.CAPTION_PERTURBATIONS)  # fmt: skip
        if value:
            perturb.parse_perturbation(value, kinds)
        return value or None

    def check_inputs(self) -> None:
        """:class:`~asymvlm.errors.ConfigError` naming the key when a local input path
        (``annotations``, ``images``, ``id_list``, a ``model`` directory) does not exist.
        URIs (``s3://`` ...) are left to the readers; a ``model`` that is not path-like is a
        hub id."""
        for key in ("annotations", "images", "id_list", "model"):
            value = getattr(self, key)
            if value is None or "://" in value and not value.lower().startswith("file://"):
                continue
            path = os.path.expanduser(value.removeprefix("file://"))
            if key == "model" and not _path_like(value) and not os.path.exists(path):
                continue  # e.g. openai/clip-vit-base-patch32
            if key == "annotations" and glob.has_magic(path):  # WebDataset shards
                if not glob.glob(path):
                    raise ConfigError(f"{key} {value!r}: no file matches this pattern")
                continue
            if not os.path.exists(path):
                raise ConfigError(f"{key} {value!r}: no such file or directory")

    def fingerprint(self, source: SourceData) -> dict[str, Any]:
        """What makes two runs the same job (output location and scheduling excluded): the
        inputs (normalised locations and a hash of the rows read from them), the model and its
        precision, perturbations, sampling and the shard size."""
        fp: dict[str, Any] = {"version": FINGERPRINT_VERSION}
        for key in ("dataset", "split", "sample", "seed", "image_perturbation",
                    "text_perturbation", "perturbation_seed", "shard_size", "dtype"):  # fmt: skip
            fp[key] = getattr(self, key)
        for key in _PATH_KEYS:
            fp[key] = _location(getattr(self, key), model=key == "model")
        fp.update(
            n_images=source.images.num_rows,
            n_captions=source.captions.num_rows,
            source_sha256=_source_digest(source, self._roots()),
            dummy_prompts=list(self.dummy_prompts) if source.prompts is not None else None,
        )
        return fp

    def _roots(self) -> list[str]:
        """The locations, as written, that readers prefix to image paths (the ``images``
        folder, else the annotation file's folder)."""
        roots = [r.rstrip("/") for r in (self.images, self.annotations) if r]
        if self.annotations:
            roots[-1] = roots[-1].rpartition("/")[0]
        return sorted({r for r in roots if r}, key=len, reverse=True)

    def _legacy_fingerprint(self, source: SourceData) -> dict[str, Any]:
        """The fingerprint as written before ``_JOB.json`` existed (finished outputs)."""
        keys = ("dataset", "model", "split", "annotations", "images", "sample", "seed", "id_list",
                "image_perturbation", "text_perturbation", "perturbation_seed")  # fmt: skip
        fp = {k: getattr(self, k) for k in keys}
        fp.update(
            shard_size=self.shard_size,
            n_images=source.images.num_rows,
            n_captions=source.captions.num_rows,
        )
        return fp


def _path_like(value: str) -> bool:
    """A model name that can only be a local directory (as the encoder decides)."""
    return os.path.isabs(value) or value.startswith(("./", "../", "~", ".\\", "..\\"))


def _location(value: str | None, model: bool = False) -> str | None:
    """A location in one spelling: local paths absolute and normalised (``file://`` URIs too),
    other URIs without a trailing slash; hub model ids as they are."""
    if value is None:
        return None
    if "://" in value and not value.lower().startswith("file://"):
        return value.rstrip("/") or value
    path = os.path.expanduser(value[len("file://") :] if "://" in value else value)
    if model and not _path_like(value) and not os.path.exists(path):
        return value
    return os.path.normpath(os.path.abspath(path))


def _source_digest(source: SourceData, roots: list[str]) -> str:
    """SHA-256 of the rows read (ids, image locations below ``roots``, labels, captions): an
    annotation file edited in place makes another job. Image paths are hashed without the
    ``roots`` prefix as written (the fingerprint holds those normalised), so a relative and an
    absolute spelling of the same input agree. Hashes Arrow buffers, not Python objects."""
    import pyarrow.compute as pc

    digest = hashlib.sha256()
    for table in (source.images, source.captions, source.prompts):
        if table is None:
            digest.update(b"\0none")
            continue
        for name in table.column_names:
            column = table.column(name)
            if table is source.images and name == "path":
                for root in roots:
                    pattern = "^" + re.escape(root) + "/"
                    column = pc.replace_substring_regex(column, pattern, "<root>/")
            digest.update(f"\0{name}:{table.schema.field(name).type}".encode())
            _digest_column(digest, column)
    return digest.hexdigest()


_BYTES_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                pa.types.is_large_binary)  # fmt: skip


def _digest_column(digest, column: pa.ChunkedArray) -> None:
    arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    n = len(arr)
    digest.update(n.to_bytes(8, "little"))
    if not n:
        return
    digest.update(np.packbits(arr.is_null().to_numpy(zero_copy_only=False)).tobytes())
    typ = arr.type
    if pa.types.is_dictionary(typ):
        arr, typ = arr.cast(typ.value_type), typ.value_type
    if any(test(typ) for test in _BYTES_TYPES):
        arr = arr.cast(pa.large_binary())
        _, offsets_buf, data_buf = arr.buffers()
        offsets = np.frombuffer(offsets_buf, np.int64)[arr.offset : arr.offset + n + 1]
        digest.update((offsets - offsets[0]).tobytes())
        if data_buf is not None:
            digest.update(memoryview(data_buf)[int(offsets[0]) : int(offsets[-1])])
    elif pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        digest.update(arr.fill_null(0).to_numpy(zero_copy_only=False).tobytes())
    else:
        digest.update(json.dumps(arr.to_pylist(), default=str).encode())


# -- orchestration ----------------------------------------------------------------------------
def _log(msg: str) -> None:
    print(f"[embed] {msg}", file=sys.stderr, flush=True)


def _ensure_ray() -> bool:
    """Connect to ``$RAY_ADDRESS`` or start a local Ray; True when this call did it."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        ray.init(include_dashboard=False)
    return True


def _blocks(table: pa.Table, rows_per_block: int) -> list[pa.Table]:
    return [table.slice(i, rows_per_block) for i in range(0, table.num_rows, rows_per_block)]


def _has_gpu(device: str) -> bool:
    if device == "cpu":
        return False
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


def _map_kwargs(cfg: EmbedConfig) -> dict[str, Any]:
    """``map_batches`` arguments of the encoder actor pool. No ``runtime_env``: credentials and
    endpoints come from each node's environment, never from the job (see the module doc)."""
    import ray

    gpu = _has_gpu(cfg.device)
    threads = None if gpu else max(1, int(ray.cluster_resources().get("CPU", 1)))
    return {
        "fn_constructor_kwargs": {
            "model": cfg.model,
            "device": "cuda" if gpu else "cpu",
            "dtype": cfg.dtype,
            "threads": threads,
            "text_batch_size": _text_batch_size(cfg),
        },
        "compute": ray.data.ActorPoolStrategy(size=cfg.num_actors),
        "num_gpus": 1 if gpu else 0,
        "num_cpus": cfg.actor_cpus,
        "batch_size": cfg.batch_size,
        "batch_format": "numpy",
    }


def _text_batch_size(cfg: EmbedConfig) -> int:
    """Captions per forward pass: the image batch size. An actor call holds the captions of
    ``batch_size`` images (~5 each), sorted by length into chunks of this size."""
    return cfg.batch_size


def _embed_images_and_captions(cfg: EmbedConfig, images: pa.Table) -> pa.Table:
    """One Ray Data pass: image rows (with their captions as JSON) -> image and caption rows."""
    import ray

    ds = ray.data.from_arrow(_blocks(images, max(cfg.batch_size, 16)))
    decode_in = cfg.decode_in
    if decode_in == "auto":
        decode_in = "tasks" if _has_gpu(cfg.device) else "actor"
    if decode_in == "actor":
        kwargs = {**_map_kwargs(cfg), "batch_format": "pyarrow"}
        kwargs["fn_constructor_kwargs"] = {
            **kwargs["fn_constructor_kwargs"],
            "image_perturbation": cfg.image_perturbation,
            "perturbation_seed": cfg.perturbation_seed,
        }
        return _to_arrow(ds.map_batches(DecodeEncodeActor, **kwargs))
    ds = ds.map_batches(decode_batch, **_decode_kwargs(cfg))
    return _to_arrow(ds.map_batches(EncoderActor, **_map_kwargs(cfg)))


def _decode_kwargs(cfg: EmbedConfig) -> dict[str, Any]:
    """``map_batches`` arguments of the CPU decode tasks (no ``runtime_env`` either)."""
    return {
        "fn_kwargs": {
            "model": cfg.model,
            "perturbation": cfg.image_perturbation,
            "seed": cfg.perturbation_seed,
        },
        "batch_format": "pyarrow",
        "batch_size": cfg.batch_size,
        "num_cpus": cfg.decode_cpus,
    }


def _embed_texts(cfg: EmbedConfig, captions: pa.Table) -> pa.Table:
    import ray

    ds = ray.data.from_arrow(
        _blocks(captions.select(["caption_id", "text"]), _text_batch_size(cfg))
    )
    return _to_arrow(ds.map_batches(TextEncoderActor, **_map_kwargs(cfg)))


def _to_arrow(ds) -> pa.Table:
    """Materialise a dataset's blocks on the driver (one group of shards at a time)."""
    import ray

    return pa.concat_tables(ray.get(ds.to_arrow_refs()))


def _part(shard: int) -> str:
    return f"part-{shard:05d}"


def _errors_table(rows: list[dict[str, str]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ERROR_SCHEMA)


def run_embed(cfg: EmbedConfig) -> dict[str, Any]:
    """Embed one split of one data set into ``cfg.output``; returns a summary dict.

    Raises :class:`~asymvlm.errors.ConfigError` for a missing input,
    :class:`~asymvlm.errors.LockError` when another writer holds ``ROOT/<split>`` and
    :class:`~asymvlm.tables.TableError` when the output belongs to another job.
    """
    t0 = time.perf_counter()
    cfg.check_inputs()
    with tables.OutputLock(cfg.output, cfg.split, log=_log) as lock:
        return _run_locked(cfg, lock, t0)


def _run_locked(cfg: EmbedConfig, lock: tables.OutputLock, t0: float) -> dict[str, Any]:
    source = read_source(
        cfg.dataset,
        annotations=cfg.annotations,
        images=cfg.images,
        split=cfg.split,
        sample=cfg.sample,
        seed=cfg.seed,
        id_list=cfg.id_list,
    )
    fingerprint = cfg.fingerprint(source)
    done = _claim(cfg, source, fingerprint, lock)
    if done is not None:
        _log(f"{cfg.output}/{cfg.split} is complete and matches this job: nothing to do")
        return {**done["summary"], "skipped": True}

    images = source.images.sort_by("image_id")
    n_img = images.num_rows
    shard_of = np.arange(n_img) // cfg.shard_size
    images = images.append_column("shard", pa.array(shard_of, pa.int64()))
    image_shard = dict(zip(images.column("image_id").to_pylist(), shard_of.tolist(), strict=True))
    captions = source.captions.sort_by([("image_id", "ascending"), ("caption_id", "ascending")])
    if cfg.text_perturbation:
        captions = _perturb_captions(captions, cfg.text_perturbation, cfg.perturbation_seed)
    n_shards = int(shard_of.max()) + 1 if n_img else 0
    pending = [
        k
        for k in range(n_shards)
        if tables.read_json(cfg.output, f"{cfg.split}/{PARTS_DIR}/{_part(k)}.json") is None
    ]
    _log(
        f"{cfg.dataset}/{cfg.split}: {n_img} images, {captions.num_rows} captions, "
        f"{n_shards} shards ({n_shards - len(pending)} already written)"
    )
    started_ray = False
    with ThreadPoolExecutor(1) as pool:
        # The manifest's provenance (processor settings, file hashes) is read while Ray works.
        info = pool.submit(_encoder_info, cfg.model)
        try:
            if pending:
                started_ray = _ensure_ray()
            for start in range(0, len(pending), cfg.shards_per_round):
                group = pending[start : start + cfg.shards_per_round]
                _embed_group(cfg, images, captions, image_shard, group, info, lock)
            if source.prompts is not None and source.prompts.num_rows:
                started_ray |= _embed_prompts(cfg, source.prompts, lock)
        finally:
            if started_ray:  # an explicit shutdown is ~1 s faster than Ray's exit hooks
                import ray

                ray.shutdown()
    totals = _totals(cfg)
    summary = {
        "dataset": cfg.dataset,
        "split": cfg.split,
        "output": cfg.output,
        **totals,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    lock.check()
    with _manifest_lock(cfg):
        manifest = tables.read_manifest(cfg.output).to_dict()
        manifest.setdefault("splits", {})[cfg.split] = {**source.description, **totals}
        tables.write_manifest(cfg.output, manifest)
    lock.check()
    tables.write_json(
        cfg.output, f"{cfg.split}/{SUCCESS}", {"fingerprint": fingerprint, "summary": summary}
    )
    _log(
        f"done: {totals['n_images']} images, {totals['n_captions']} captions, "
        f"{totals['n_image_errors']} image errors, {totals['n_caption_errors']} caption errors "
        f"-> {cfg.output}/{cfg.split}"
    )
    return summary


def _manifest_lock(cfg: EmbedConfig) -> tables.OutputLock:
    """``ROOT/manifest.json`` is shared by the splits: read-modify-write it under a short lock
    (waiting for a job on another split that is updating it)."""
    return tables.OutputLock(cfg.output, "", name="manifest", wait=60.0, ttl=30.0,
                             renew_every=10.0, log=_log)  # fmt: skip


def _claim(
    cfg: EmbedConfig, source: SourceData, fingerprint: dict[str, Any], lock: tables.OutputLock
) -> dict[str, Any] | None:
    """Check the output's identity before any write (refusing another job's output) and record
    this job's in ``_JOB.json``; returns ``_SUCCESS.json`` when this very job is complete."""
    shown = f"{cfg.output.rstrip('/')}/{cfg.split}"
    done = tables.read_json(cfg.output, f"{cfg.split}/{SUCCESS}")
    if done is not None:
        stored = done.get("fingerprint") or {}
        ours = fingerprint if "version" in stored else cfg._legacy_fingerprint(source)
        _refuse_other_job(shown, "holds a finished embedding of another job", ours, stored)
        return done
    job = tables.read_json(cfg.output, f"{cfg.split}/{JOB}")
    if job is not None:
        _refuse_other_job(shown, "was written by another job", fingerprint,
                          job.get("fingerprint") or {})  # fmt: skip
        _log(f"resuming the job recorded in {shown}/{JOB}")
        return None
    stray = _written_parts(cfg)
    if stray:
        raise tables.TableError(
            f"{shown} holds {stray} but no {JOB} saying which job wrote it (an output of an "
            "older version, or copied files); cannot tell whether it belongs to this job -- "
            "choose another --output, or delete that folder to start over"
        )
    lock.check()
    tables.write_json(
        cfg.output,
        f"{cfg.split}/{JOB}",
        {
            "fingerprint": fingerprint,
            "created": time.time(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        },
    )
    return None


def _refuse_other_job(shown: str, what: str, ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """:class:`TableError` listing the fields that differ, this job's value first."""
    diffs = []
    for key in sorted(set(ours) | set(theirs)):
        if key == "version":
            continue
        a, b = ours.get(key), theirs.get(key)
        if key in _PATH_KEYS and a is not None and b is not None:
            a_norm, b_norm = _location(a, model=key == "model"), _location(b, model=key == "model")
            if a == b or a_norm == b_norm:
                continue
        if a != b and key in theirs:
            if key == "source_sha256":
                a, b = f"{a}"[:12] + "...", f"{b}"[:12] + "..."
            diffs.append(f"{key} {a!r} here vs {b!r} there")
    if diffs:
        raise tables.TableError(
            f"{shown} {what}: {'; '.join(diffs)}; choose another --output (or --split)"
        )


def _written_parts(cfg: EmbedConfig) -> str | None:
    """What an output already holds (parquet parts or shard markers), or None if nothing."""
    fs, base = storage.filesystem(cfg.output)
    for kind in (tables.IMAGES_DIR, tables.TEXTS_DIR, ERRORS_DIR, PROMPTS_DIR):
        if tables._list_parquet(fs, tables._join(base, cfg.split, kind)):
            return f"{kind}/ parts"
    markers = fs.get_file_info(
        tables.pafs.FileSelector(tables._join(base, cfg.split, PARTS_DIR), allow_not_found=True)
    )
    if any(m.base_name.endswith(".json") for m in markers):
        return f"{PARTS_DIR}/ markers"
    return None


def _embed_prompts(cfg: EmbedConfig, prompts: pa.Table, lock: tables.OutputLock) -> bool:
    """Classification sets: class-name prompts (class x template) -> ``ROOT/split/prompts``.

    Returns whether it had to start Ray."""
    if tables.read_parts(cfg.output, cfg.split, PROMPTS_DIR) is not None:
        return False
    started = _ensure_ray()
    if cfg.dummy_prompts:
        extra = (
            pa.table(
                {
                    "class_index": pa.array(
                        [-1] * len(cfg.dummy_prompts), prompts.schema.field("class_index").type
                    ),
                    "class_name": pa.array([""] * len(cfg.dummy_prompts), pa.string()),
                    "template": pa.array([""] * len(cfg.dummy_prompts), pa.string()),
                    "text": pa.array(list(cfg.dummy_prompts), pa.string()),
                }
            )
            .select(prompts.column_names)
            .cast(prompts.schema)
        )
        prompts = pa.concat_tables([prompts, extra])
    ids = [
        f"class{c}-t{t}"
        for c, t in zip(
            prompts.column("class_index").to_pylist(), range(prompts.num_rows), strict=True
        )
    ]
    keyed = prompts.append_column("caption_id", pa.array(ids, pa.string()))
    out = _embed_texts(cfg, keyed)
    pos = {cid: i for i, cid in enumerate(out.column("caption_id").to_pylist())}
    order = pa.array([pos[c] for c in ids], pa.int64())
    emb = tables.column_matrix(out.column("embedding"))[np.asarray(order)]
    table = (
        keyed.drop_columns(["caption_id"])
        .append_column(
            "embedding", pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), emb.shape[1])
        )
        .append_column("norm", out.column("norm").take(order))
    )
    lock.check()
    tables.write_part(cfg.output, cfg.split, PROMPTS_DIR, "part-00000", table)
    return started


def _totals(cfg: EmbedConfig) -> dict[str, int]:
    counts = defaultdict(int)
    fs_root = cfg.output
    for kind in (tables.IMAGES_DIR, tables.TEXTS_DIR):
        t = tables.read_parts(fs_root, cfg.split, kind)
        counts[f"n_{'images' if kind == tables.IMAGES_DIR else 'captions'}"] = (
            0 if t is None else t.num_rows
        )
    errors = tables.read_parts(fs_root, cfg.split, ERRORS_DIR)
    if errors is not None:
        kinds = errors.column("kind").to_pylist()
        counts["n_image_errors"] = kinds.count("image")
        counts["n_caption_errors"] = kinds.count("caption")
    counts.setdefault("n_image_errors", 0)
    counts.setdefault("n_caption_errors", 0)
    return dict(counts)


def _embed_group(
    cfg: EmbedConfig,
    images: pa.Table,
    captions: pa.Table,
    image_shard: dict[str, int],
    group: list[int],
    info: Future,
    lock: tables.OutputLock,
) -> None:
    """Embed the images and captions of some shards and write them (marker last)."""
    import pyarrow.compute as pc

    wanted = pa.array(group, pa.int64())
    todo = images.filter(pc.is_in(images.column("shard"), wanted))
    errors: dict[int, list[dict[str, str]]] = defaultdict(list)

    # This group's captions ride with their image (JSON [[caption_id, text], ...]); empty
    # captions become errors before any work is done.
    cap_ids = captions.column("image_id").to_pylist()
    cap_shard = np.array([image_shard.get(i, -1) for i in cap_ids], dtype=np.int64)
    group_caps = captions.filter(pa.array(np.isin(cap_shard, np.array(group))))
    attached: dict[str, list[list[str]]] = defaultdict(list)
    keep = []
    for i, row in enumerate(group_caps.select(["caption_id", "image_id", "text"]).to_pylist()):
        if (row["text"] or "").strip():
            attached[row["image_id"]].append([row["caption_id"], row["text"]])
            keep.append(i)
        else:
            errors[image_shard[row["image_id"]]].append(
                {"kind": "caption", "id": row["caption_id"], "path": "", "reason": "empty caption"}
            )
    group_caps = group_caps.take(pa.array(keep, pa.int64()))
    todo_ids = todo.column("image_id").to_pylist()
    payload = [json.dumps(attached.get(i, []), ensure_ascii=False) for i in todo_ids]
    _log(
        f"shards {group[0]}..{group[-1]}: embedding {todo.num_rows} images and "
        f"{group_caps.num_rows} captions"
    )
    out = _embed_images_and_captions(
        cfg, todo.append_column("captions", pa.array(payload, pa.string()))
    )
    is_image = pc.equal(out.column("kind"), "image")
    img_out = out.filter(is_image)
    txt_out = out.filter(pc.invert(is_image))
    ok_mask = pc.equal(img_out.column("error"), "")
    ok_images = img_out.filter(ok_mask)
    failed = img_out.filter(pc.invert(ok_mask))

    failed_ids = set()
    for row in failed.select(["image_id", "path", "shard", "error"]).to_pylist():
        failed_ids.add(row["image_id"])
        errors[row["shard"]].append(
            {"kind": "image", "id": row["image_id"], "path": row["path"], "reason": row["error"]}
        )
        for caption_id, _ in attached.get(row["image_id"], []):
            errors[row["shard"]].append(
                {"kind": "caption", "id": caption_id, "path": "",
                 "reason": f"image {row['image_id']} failed"}
            )  # fmt: skip
    for rows in errors.values():
        rows.sort(key=lambda r: (r["kind"] != "image", r["id"]))
    if failed_ids:
        group_caps = group_caps.filter(
            pc.invert(pc.is_in(group_caps.column("image_id"), pa.array(sorted(failed_ids))))
        )
    if not txt_out.num_rows:
        txt_out = None

    # Join results back by id and write shard by shard.
    text_by_id: dict[str, int] = {}
    if txt_out is not None:
        text_by_id = {cid: i for i, cid in enumerate(txt_out.column("id").to_pylist())}
    img_ids = ok_images.column("image_id").to_pylist()
    img_pos = {iid: i for i, iid in enumerate(img_ids)}
    img_emb = tables.column_matrix(ok_images.column("embedding"))
    img_norm = ok_images.column("norm").to_numpy()
    txt_emb = tables.column_matrix(txt_out.column("embedding")) if txt_out is not None else None
    txt_norm = txt_out.column("norm").to_numpy() if txt_out is not None else None
    dim = img_emb.shape[1] if img_emb.size else (txt_emb.shape[1] if txt_emb is not None else 0)
    if not dim:  # every image of these shards failed: the model still says what dim is
        dim = int(info.result()["dim"])
        if failed.num_rows:
            _log(
                f"every image of shards {group[0]}..{group[-1]} failed to load, e.g. "
                f"{failed.column('path')[0].as_py()}: {failed.column('error')[0].as_py()} "
                "(check --images and the storage credentials of the Ray nodes)"
            )

    lock.check()
    _write_manifest_once(cfg, dim, info)
    # Source image columns worth keeping (e.g. `label` of classification sets), by image id.
    carried = [c for c in todo.column_names if c not in _SOURCE_IMAGE_COLUMNS]
    todo_pos = {iid: i for i, iid in enumerate(todo.column("image_id").to_pylist())}
    extra_names = [
        c for c in group_caps.column_names if c not in ("caption_id", "image_id", "text")
    ]
    for shard in group:
        shard_ids = sorted(i for i in img_ids if image_shard[i] == shard)
        rows_i = np.array([img_pos[i] for i in shard_ids], dtype=np.int64)
        caps = group_caps.filter(
            pc.is_in(group_caps.column("image_id"), pa.array(shard_ids, pa.string()))
        )
        rows_t = np.array(
            [text_by_id[c] for c in caps.column("caption_id").to_pylist()], dtype=np.int64
        )
        part = _part(shard)
        lock.check()
        tables.write_part(
            cfg.output, cfg.split, ERRORS_DIR, part, _errors_table(errors.get(shard, []))
        )
        tables.write_split(
            cfg.output,
            cfg.split,
            image_ids=shard_ids,
            image_embeddings=img_emb[rows_i].reshape(len(rows_i), dim),
            extra_image_columns={
                "norm": img_norm[rows_i],
                **{
                    c: todo.column(c)
                    .take(pa.array([todo_pos[i] for i in shard_ids], pa.int64()))
                    .to_numpy(zero_copy_only=False)
                    for c in carried
                },
            },
            caption_ids=caps.column("caption_id").to_pylist(),
            caption_image_ids=caps.column("image_id").to_pylist(),
            texts=caps.column("text").to_pylist(),
            text_embeddings=(
                txt_emb[rows_t] if txt_emb is not None else np.zeros((0, dim), np.float32)
            ).reshape(len(rows_t), dim),
            text_norms=txt_norm[rows_t] if txt_norm is not None else np.zeros(0, np.float32),
            extra_text_columns={
                c: caps.column(c).to_numpy(zero_copy_only=False) for c in extra_names
            },
            part=part,
        )
        tables.write_json(
            cfg.output,
            f"{cfg.split}/{PARTS_DIR}/{part}.json",
            {"images": len(shard_ids), "captions": caps.num_rows,
             "errors": len(errors.get(shard, []))},
        )  # fmt: skip


def _encoder_info(model: str) -> dict[str, Any]:
    from asymvlm.data.encoder import Encoder

    return Encoder(model, device="cpu", load_model=False).info.to_dict()


def _write_manifest_once(cfg: EmbedConfig, dim: int, info: Future) -> None:
    """Write (or check) ``ROOT/manifest.json`` before the first parquet part of this job; the
    manifest lock is only taken when there is none yet (then checked again under it)."""
    if _check_manifest(cfg, dim):
        return
    with _manifest_lock(cfg):
        if _check_manifest(cfg, dim):
            return
        manifest = dict(info.result())
        manifest.update(model=cfg.model, dim=dim, embedding_dtype="float32", normalised=True)
        tables.write_manifest(cfg.output, manifest)


def _check_manifest(cfg: EmbedConfig, dim: int) -> bool:
    """True if ``ROOT/manifest.json`` exists and matches this model and dim; raises if it
    belongs to another model (spellings of one local model directory are the same model)."""
    existing = tables.read_json(cfg.output, tables.MANIFEST_NAME)
    if existing is None:
        return False
    model = existing.get("model")
    same = model == cfg.model or (
        isinstance(model, str) and _location(model, model=True) == _location(cfg.model, True)
    )
    if not same or int(existing.get("dim", -1)) != dim:
        raise tables.TableError(
            f"{cfg.output} holds embeddings of model {model!r} (dim {existing.get('dim')}); "
            f"refusing to add {cfg.model!r} (dim {dim})"
        )
    return True
