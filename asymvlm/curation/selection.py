"""The selections of a scored pool: where each :class:`SelectionRule` cuts (fractions found on
fine histograms, in bounded memory), the kept rows as Parquet and, where rows have DataComp
uids, DataComp's selection file (a sorted ``.npy`` of uint64 uid pairs)."""

from __future__ import annotations

import contextlib
import io
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel

from asymvlm import storage
from asymvlm.curation.curate_config import SelectionRule
from asymvlm.curation.shard_scores import score_schema, scores_uri
from asymvlm.storage import StorageError

SELECTIONS_DIR = "selections"
#: ln κ in bins 0.001 wide (κ to 0.1 %), CLIP score in bins 1e-4 wide.
LOG_KAPPA_EDGES = np.linspace(-10.0, 25.0, 35_001)
CLIP_EDGES = np.linspace(-1.0, 1.0, 20_001)


@dataclass
class Histogram:
    """Counts of values on fixed ``edges`` (values outside go to the end bins)."""

    edges: np.ndarray
    counts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.counts = np.zeros(len(self.edges) - 1, np.int64)

    def add(self, values: np.ndarray) -> None:
        bins = np.clip(
            np.searchsorted(self.edges, values, side="right") - 1, 0, len(self.counts) - 1
        )
        self.counts += np.bincount(bins, minlength=len(self.counts))

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def top_fraction_cut(self, fraction: float) -> float:
        """The lowest edge above which at least ``fraction`` of the values lie (-inf: the first
        bin's, which also holds the values below the edges)."""
        above = np.cumsum(self.counts[::-1])[::-1]  # values in this bin and above
        enough = np.nonzero(above >= fraction * self.total)[0]
        last = enough[-1] if len(enough) else 0
        return float(self.edges[last]) if last > 0 else -np.inf

    def coarse(self, bins: int = 100) -> dict[str, list[float]]:
        """The occupied range in ``bins`` bins, for people: ``edges``, ``counts``."""
        used = np.nonzero(self.counts)[0]
        if not len(used):
            return {"edges": [], "counts": []}
        lo, hi = used[0], used[-1] + 1
        groups = np.array_split(np.arange(lo, hi), min(bins, hi - lo))
        edges = [float(self.edges[g[0]]) for g in groups] + [float(self.edges[hi])]
        return {"edges": edges, "counts": [int(self.counts[g].sum()) for g in groups]}


class RuleOutcome(BaseModel):
    """Where a rule cut (κ and CLIP-score thresholds, None: not used) and what it kept of the
    ``scored`` captions."""

    name: str
    kappa_min: float | None
    clip_min: float | None
    kept: int
    scored: int
    fraction: float
    files: list[str]


def read_scores(output: str, shard: str, columns: list[str]) -> pa.Table:
    """``columns`` of a shard's scores, read afresh (another process may have just written)."""
    uri = scores_uri(output, shard)
    data = storage.read_bytes(uri)
    if data is None:
        raise StorageError(f"{uri}: the scores of shard {shard} are gone")
    return pq.read_table(io.BytesIO(data), columns=columns)


def histograms(output: str, shards: Sequence[str]) -> tuple[Histogram, Histogram]:
    """(ln κ, CLIP score) histograms of the scored rows of ``shards``."""
    kappa, clip = Histogram(LOG_KAPPA_EDGES), Histogram(CLIP_EDGES)
    for shard in shards:
        table = read_scores(output, shard, ["kappa", "clip_score"])
        kappa.add(np.log(table["kappa"].drop_null().to_numpy()))
        clip.add(table["clip_score"].drop_null().to_numpy())
    return kappa, clip


def thresholds(rule: SelectionRule, kappa: Histogram, clip: Histogram) -> tuple[float | None, ...]:
    """The rule's (κ, CLIP score) thresholds: its own, or where its fractions cut."""
    kappa_min = rule.kappa_min
    if rule.most_specific is not None:
        cut = float(np.exp(kappa.top_fraction_cut(rule.most_specific)))
        kappa_min = cut if kappa_min is None else max(kappa_min, cut)
    clip_min = rule.clip_min
    if rule.clip_top is not None:
        cut = clip.top_fraction_cut(rule.clip_top)
        clip_min = cut if clip_min is None else max(clip_min, cut)
    return kappa_min, clip_min


def datacomp_uids(uids: Sequence[str]) -> np.ndarray:
    """DataComp's selection: each 128-bit hex uid as two uint64, sorted."""
    pairs = np.array([(int(u[:16], 16), int(u[16:32], 16)) for u in uids], np.dtype("u8,u8"))
    pairs.sort()
    return pairs


def write_selections(
    output: str, shards: Sequence[str], rules: Sequence[SelectionRule], uid: bool, captioned: int
) -> tuple[list[RuleOutcome], Histogram]:
    """Each rule's kept rows as ``selections/RULE.parquet`` (shard, row, key[, uid], κ, CLIP
    score) and, with ``uid``, ``selections/RULE.npy``; the ln κ histogram. ``captioned``: the
    rows with a caption, of which each rule keeps a fraction."""
    kappa, clip = histograms(output, shards)
    cuts = {rule.name: thresholds(rule, kappa, clip) for rule in rules}
    columns = ["row", "key", *(["uid"] if uid else []), "kappa", "clip_score"]
    scored = score_schema(0, uid, mu=False)
    schema = pa.schema([pa.field("shard", pa.string()), *(scored.field(c) for c in columns)])
    kept: dict[str, list[str]] = {rule.name: [] for rule in rules}
    counts = dict.fromkeys(kept, 0)
    with contextlib.ExitStack() as stack:  # each writer closed before its file
        writers = {}
        for rule in rules:
            uri = storage.uri_join(output, SELECTIONS_DIR, f"{rule.name}.parquet")
            fs, path = storage.fsspec_filesystem(uri)
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
            out = stack.enter_context(fs.open(path, "wb"))
            writers[rule.name] = stack.enter_context(pq.ParquetWriter(out, schema))
        for shard in shards:
            table = read_scores(output, shard, columns)
            table = table.add_column(0, "shard", pa.array([shard] * table.num_rows, pa.string()))
            for name, (kappa_min, clip_min) in cuts.items():
                mask = pa.array(np.ones(table.num_rows, bool))  # a null value meets no condition
                if kappa_min is not None:
                    mask = pc.and_(mask, pc.greater_equal(table["kappa"], kappa_min))
                if clip_min is not None:
                    mask = pc.and_(mask, pc.greater_equal(table["clip_score"], clip_min))
                chosen = table.filter(pc.fill_null(mask, False))
                writers[name].write_table(chosen)
                counts[name] += chosen.num_rows
                if uid:
                    kept[name] += chosen["uid"].to_pylist()
    results = []
    for rule in rules:
        files = [storage.uri_join(output, SELECTIONS_DIR, f"{rule.name}.parquet")]
        if uid:
            files.append(storage.uri_join(output, SELECTIONS_DIR, f"{rule.name}.npy"))
            with storage.atomic_path(files[-1]) as (fs, tmp), fs.open_output_stream(tmp) as f:
                np.save(f, datacomp_uids(kept[rule.name]))
        kappa_min, clip_min = cuts[rule.name]
        results.append(
            RuleOutcome(
                name=rule.name,
                kappa_min=kappa_min,
                clip_min=clip_min,
                kept=counts[rule.name],
                scored=captioned,
                fraction=counts[rule.name] / max(captioned, 1),
                files=files,
            )
        )
    return results, kappa
