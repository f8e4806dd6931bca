"""A curation job's shards scored on Ray Data (docs/curate.md): one row per shard through an
actor pool (a GPU each where there are some), each actor reading its shard in bounded batches
and writing the shard's scores whole; the driver sees each shard's outcome as it ends."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
import ray
import torch

from asymvlm.curation.job import CurationPlan, Executor
from asymvlm.curation.pools import PoolShard
from asymvlm.curation.shard_scores import ShardOutcome, ShardScorer
from asymvlm.errors import Unfinished
from asymvlm_ray.schema import FaultInjection
from asymvlm_ray.session import RaySession


class _ScoreShards:
    """A Ray Data actor: a :class:`ShardScorer` on the node's device, a shard per row."""

    def __init__(self, options: dict, threads: int | None) -> None:
        device = "cuda" if options.pop("gpu") and torch.cuda.is_available() else "cpu"
        if threads:  # Ray pins an actor's threads to its num_cpus: the node's share instead
            torch.set_num_threads(threads)
        self.scorer = ShardScorer(**options, device=device)
        self.fault = FaultInjection.from_environment()  # a drill: after this actor's N-th shard
        self.scored = 0

    def __call__(self, batch: pa.Table) -> pa.Table:
        outcomes = []
        for row in batch.to_pylist():
            shard = PoolShard(row["name"], row["format"], json.loads(row["files"]))
            outcomes.append(self.scorer(shard).model_dump())
            self.scored += 1
            if self.fault is not None and self.fault.shards == self.scored:
                self.fault.fire("a curation actor", f"{self.scored} shards")
        return pa.Table.from_pylist(outcomes)


def score_on_ray(plan: CurationPlan, session: RaySession) -> Executor:
    """:func:`asymvlm.curation.curate`'s executor on ``session``'s Ray (started here)."""
    session.require()
    cfg = plan.cfg
    gpu = cfg.device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0
    options = {
        "checkpoint": cfg.checkpoint,
        "output": cfg.output,
        "encoder": cfg.encoder,
        "write_mu": cfg.write_mu,
        "rows_per_batch": cfg.rows_per_batch,
        "features": plan.features,
        "tracking_uri": cfg.tracking_uri,
        "gpu": gpu,
    }
    nodes = [n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]]
    share = int(ray.cluster_resources().get("CPU", 1)) // cfg.num_actors  # one node's at most
    threads = None if gpu else max(1, min(share, int(max(nodes, default=1))))

    def run(shards: list[PoolShard]) -> Iterator[ShardOutcome]:
        if not shards:
            return
        items = [{"name": s.name, "format": s.format, "files": json.dumps(s.files)} for s in shards]
        outcomes = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            _ScoreShards,
            fn_constructor_args=(options, threads),
            batch_size=1,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=cfg.num_actors),
            # Not restarted by Ray (ray-project/ray#57733, as the embedding stage): a lost actor
            # ends the job, and the same command goes on from the shards written whole.
            max_restarts=0,
            num_gpus=1 if gpu else 0,
            num_cpus=1,
        )
        try:
            for row in outcomes.iter_rows():
                yield ShardOutcome(**row)
        except ray.exceptions.RayError as err:  # an actor or its node lost
            what = " ".join(str(err).split())[:300]
            raise Unfinished(
                f"the scoring stopped ({type(err).__name__}: {what}); the shards written are "
                "kept: run the same command again to go on"
            ) from None

    return run
