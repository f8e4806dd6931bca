"""A curation job from start to end (docs/curate.md): its checks before any work, the shards
left to score, scoring them (in this process, or by the caller's executor: Ray Data's in the
pipeline), the selections, the figure, ``curation.json`` and one MLflow run."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from pydantic import BaseModel

from asymvlm import storage, tables
from asymvlm.checkpoints import load_checkpoint, resolve_checkpoint
from asymvlm.checkpoints.folder import WEIGHTS_FILE
from asymvlm.curation.curate_config import CurateConfig
from asymvlm.curation.pools import (
    DATACOMP_FEATURES,
    PoolShard,
    detect_format,
    find_shards,
    npy_header,
    parquet_rows,
)
from asymvlm.curation.selection import RuleOutcome, read_scores, write_selections
from asymvlm.curation.shard_scores import (
    SCORES_DIR,
    ShardOutcome,
    ShardScorer,
    uncaptioned,
)
from asymvlm.errors import ConfigError
from asymvlm.extras import check_extras, missing_extra
from asymvlm.methods import Method

logger = logging.getLogger(__name__)
JOB_FILE, SUMMARY_FILE, FIGURE_FILE = "_JOB.json", "curation.json", "kappa.png"
#: Runs the shards it is given, yielding each one's outcome as it ends.
Executor = Callable[[list[PoolShard]], Iterable[ShardOutcome]]


@dataclass
class CurationPlan:
    """A job checked before any work: its shards, those already scored, the adapter's needs."""

    cfg: CurateConfig
    format: str
    shards: list[PoolShard]
    done: list[str]
    features: str
    has_images: bool

    @property
    def pending(self) -> list[PoolShard]:
        return [s for s in self.shards if s.name not in set(self.done)]


class CurationSummary(BaseModel):
    """What a job did: per shard, per rule, in all (``curation.json``)."""

    pool: str
    format: str
    output: str
    shards: list[ShardOutcome]
    rules: list[RuleOutcome]
    rows: int
    null_captions: int
    failed: list[ShardOutcome]
    kappa_histogram: dict[str, list[float]]
    seconds: float


def _pool_dim(shard: PoolShard, features: str) -> tuple[int | None, str]:
    """The pool's text-embedding dimension (None: captions to embed) and where it was read."""
    if shard.format == "clip-retrieval" and "text_emb" in shard.files:
        return int(npy_header(shard.files["text_emb"])[0][1]), shard.files["text_emb"]
    if shard.format == "datacomp" and "npz" in shard.files:
        return DATACOMP_FEATURES[features], shard.files["npz"]
    if shard.format == "tables":
        return int(tables.read_manifest(shard.files["root"]).dim), shard.files["root"]
    return None, ""


def _check_lengths(shards: list[PoolShard]) -> None:
    """clip-retrieval: each .npy has as many rows as its metadata parquet."""
    for shard in shards:
        rows = None
        for kind in ("text_emb", "img_emb"):
            if kind in shard.files:
                rows = parquet_rows(shard.files["rows"]) if rows is None else rows
                npy = int(npy_header(shard.files[kind])[0][0])
                if npy != rows:
                    raise ConfigError(
                        f"{shard.files[kind]} has {npy} rows, {shard.files['rows']} {rows}: "
                        "the embeddings and the metadata must match row for row"
                    )


def _claim(cfg: CurateConfig, format: str, adapter_sha256: str) -> None:
    """Refuse an output written by another job; record this one."""
    job = {"pool": storage.absolute(cfg.pool), "format": format, "adapter": adapter_sha256}
    job |= {"write_mu": cfg.write_mu, "features": cfg.features, "split": cfg.split}
    theirs = storage.read_json(cfg.output, JOB_FILE)
    if theirs is not None and theirs != job:
        diffs = [
            f"{k} {job[k]!r} here vs {theirs.get(k)!r} there"
            for k in job
            if theirs.get(k) != job[k]
        ]
        raise ConfigError(
            f"{cfg.output} holds another curation job ({'; '.join(diffs)}): choose another --output"
        )
    if theirs is None:
        storage.write_json(cfg.output, JOB_FILE, job)


def _check_adapter(
    cfg: CurateConfig, method: Method, meta: dict, pool_dim: int | None, where: str
) -> None:
    """The adapter takes the pool's embeddings, or has an encoder for its captions."""
    name, dim = meta["method"], int(meta["dim"])
    if pool_dim is not None and pool_dim != dim:
        raise ConfigError(
            f"{where}: text embeddings of {pool_dim} dimensions, the adapter ({name}) takes {dim}"
        )
    recorded = (meta.get("encoder") or {}).get("model") or meta.get("embedding_model")
    if pool_dim is None and not cfg.encoder and recorded in (None, "synthetic-world"):
        raise ConfigError(
            f"{cfg.pool}: its captions are to be embedded, and the adapter names no encoder "
            "(it was trained on tables without one): give --encoder"
        )
    if pool_dim is not None and getattr(method, "USES_PRE_FEATURES", False):
        raise ConfigError(f"{name} needs pre-projection features, which {where} lacks")


def _check_rules(cfg: CurateConfig, method: Method, name: str, has_images: bool) -> None:
    """No rule keeps nothing for want of κ or of a CLIP score."""
    has_kappa = method.kappa(torch.zeros(1, method.dim)) is not None
    for rule in cfg.rules:
        if rule.uses_kappa and not has_kappa:
            raise ConfigError(f"rule {rule.name!r} keeps nothing: {name} has no κ")
        if rule.uses_clip and not has_images:
            raise ConfigError(
                f"rule {rule.name!r} keeps nothing: the pool has no image embeddings, "
                "hence no CLIP score"
            )


def plan_job(cfg: CurateConfig) -> CurationPlan:
    """Every check that needs no scoring, each a :class:`ConfigError` (one line) before work;
    then the job's output claimed and the shards it has scored already found."""
    if cfg.tracking_uri:
        check_extras("tracking")  # before the work it would log, not after it
    format = detect_format(cfg.pool) if cfg.format == "auto" else cfg.format
    shards = find_shards(cfg.pool, format, cfg.split)
    if not shards:
        raise ConfigError(f"{cfg.pool}: no {format} shards found")
    folder = resolve_checkpoint(cfg.checkpoint, cfg.tracking_uri)
    method, meta = load_checkpoint(folder, "cpu")
    features = cfg.features
    if features == "auto":
        features = next((k for k, d in DATACOMP_FEATURES.items() if d == method.dim), "b32")
    pool_dim, where = _pool_dim(shards[0], features)
    _check_adapter(cfg, method, meta, pool_dim, where)
    _check_lengths(shards)
    has_images = any(
        "img_emb" in s.files or "npz" in s.files or s.format == "tables" for s in shards
    )
    _check_rules(cfg, method, meta["method"], has_images)
    if pool_dim is not None and format != "tables" and meta.get("adapter_input") == "raw":
        logger.warning(
            "%s was trained on raw text embeddings; the pool's are unit vectors: its κ is "
            "the κ of the unit vectors, not of the raw ones the encoder gives",
            meta["method"],
        )
    with open(os.path.join(folder, WEIGHTS_FILE), "rb") as f:
        _claim(cfg, format, hashlib.file_digest(f, "sha256").hexdigest())
    scored = storage.list_names(storage.uri_join(cfg.output, SCORES_DIR))
    done = [s.name for s in shards if f"{s.name}.parquet" in scored]
    return CurationPlan(cfg, format, shards, done, features, has_images)


def score_here(plan: CurationPlan) -> Executor:
    """The shards scored one after another in this process."""
    cfg = plan.cfg
    scorer = ShardScorer(
        cfg.checkpoint,
        cfg.output,
        encoder=cfg.encoder,
        device="cuda" if cfg.device != "cpu" and torch.cuda.is_available() else "cpu",
        write_mu=cfg.write_mu,
        rows_per_batch=cfg.rows_per_batch,
        features=plan.features,
        tracking_uri=cfg.tracking_uri,
    )

    def run(shards: list[PoolShard]) -> Iterator[ShardOutcome]:
        return map(scorer, shards)

    return run


def _figure(summary: CurationSummary, folder: str) -> str | None:
    """The figure of κ and each rule's cut, drawn in ``folder`` (None without matplotlib)."""
    try:
        from asymvlm.report.figures import plot_kappa_cuts
    except ImportError as err:
        logger.info("no figure of κ: %s", missing_extra(err) or err)
        return None
    cuts = {r.name: r.kappa_min for r in summary.rules if r.kappa_min is not None}
    return plot_kappa_cuts(summary.kappa_histogram, cuts, os.path.join(folder, FIGURE_FILE))


def _log(cfg: CurateConfig, summary: CurationSummary, figure: str | None) -> None:
    from asymvlm import tracking

    with tracking.run(cfg.tracking_uri, cfg.experiment, "curate", kind="curate") as run:
        run.log_params(
            {
                "pool": cfg.pool,
                "format": summary.format,
                "output": cfg.output,
                "checkpoint": cfg.checkpoint,
                "shards": len(summary.shards),
            }
        )
        run.log_params(
            {
                f"rule.{r.name}": r.model_dump_json(include={"kappa_min", "clip_min"})
                for r in summary.rules
            }
        )
        numbers = {
            "rows": summary.rows,
            "null_captions": summary.null_captions,
            "failed_shards": len(summary.failed),
            "seconds": summary.seconds,
        }
        run.log_metrics(numbers | {f"kept_fraction.{r.name}": r.fraction for r in summary.rules})
        run.log_json("shards.json", [s.model_dump() for s in summary.shards])
        run.log_json("kappa_histogram.json", summary.kappa_histogram)
        if figure:
            run.log_artifact(figure)


def curate(
    cfg: CurateConfig, executor: Callable[[CurationPlan], Executor] = score_here
) -> CurationSummary:
    """Score every shard not scored yet, then write the selections, the figure, the summary
    and (with ``cfg.tracking_uri``) the MLflow run. A failed shard is named and left out."""
    started = time.perf_counter()
    plan = plan_job(cfg)
    pending = plan.pending
    logger.info(
        "%s: %d %s shards, %d scored already, %d to score",
        cfg.pool,
        len(plan.shards),
        plan.format,
        len(plan.done),
        len(pending),
    )
    outcomes = {}
    rows = 0
    for i, outcome in enumerate(executor(plan)(pending) if pending else [], 1):
        outcomes[outcome.shard] = outcome
        if outcome.error:
            logger.error("shard %s left out: %s", outcome.shard, outcome.error)
            continue
        rows += outcome.rows
        rate = rows / max(time.perf_counter() - started, 1e-9)
        logger.info(
            "[%d/%d] %s: %d rows (%d without caption); %.0f rows/s",
            i,
            len(pending),
            outcome.shard,
            outcome.rows,
            outcome.null_captions,
            rate,
        )
    for name in plan.done:
        outcomes[name] = _scored_outcome(cfg.output, name)
    ordered = [outcomes[s.name] for s in plan.shards if s.name in outcomes]
    failed = [o for o in ordered if o.error]
    scored = [o.shard for o in ordered if not o.error]
    uid = plan.format == "datacomp"
    captioned = sum(o.rows - o.null_captions for o in ordered if not o.error)
    rules, histogram = write_selections(cfg.output, scored, cfg.rules, uid, captioned)
    for rule in rules:
        if not rule.kept:
            logger.warning("rule %s kept nothing of %d captions", rule.name, rule.scored)
    summary = CurationSummary(
        pool=cfg.pool,
        format=plan.format,
        output=cfg.output,
        shards=ordered,
        rules=rules,
        rows=sum(o.rows for o in ordered),
        null_captions=sum(o.null_captions for o in ordered),
        failed=failed,
        kappa_histogram=histogram.coarse(),
        seconds=round(time.perf_counter() - started, 3),
    )
    storage.write_json(cfg.output, SUMMARY_FILE, summary.model_dump())
    with tempfile.TemporaryDirectory() as folder:
        figure = _figure(summary, folder)
        if figure:
            with open(figure, "rb") as f:
                storage.write_bytes(storage.uri_join(cfg.output, FIGURE_FILE), f.read())
        if cfg.tracking_uri:
            _log(cfg, summary, figure)
    return summary


def _scored_outcome(output: str, shard: str) -> ShardOutcome:
    """The outcome of a shard scored by an earlier run, from its file."""
    captions = read_scores(output, shard, ["has_caption"])["has_caption"]
    return ShardOutcome(shard=shard, rows=len(captions), null_captions=uncaptioned(captions))
