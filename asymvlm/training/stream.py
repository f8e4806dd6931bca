"""Training on tables bigger than memory: captions streamed from the parquet parts.

The in-memory :class:`~asymvlm.training.Trainer` holds the whole split on the device and draws
one exact permutation of the captions per epoch. Here only the **image table** stays resident
(its ``embedding`` and ``norm`` columns as one ``[n_image, dim]`` float32 tensor on the
device, plus the ids to pair captions with it); the **captions stream**:

* every epoch the caption part files (``ROOT/<split>/texts/*.parquet``) are visited in an
  order shuffled by ``(seed, epoch)``, one part read at a time (the next one is read ahead in a
  thread while the current one trains);
* each part's rows are mixed with a carry-over buffer of ``shuffle_buffer`` rows from the
  parts before it (the pooled rows are permuted by a ``(seed, epoch, rank)`` generator, all
  but ``shuffle_buffer`` of them leave as batches, the rest is carried on); the buffer is
  emptied at the end of the epoch;
* a caption is paired with its image by ``image_id`` against the resident image table, so the
  caption parts need not be aligned with the image parts.

Memory: the image table (``n_image * dim * 4`` bytes; a fifth to a tenth of the split for
COCO/CC-like data with 5-10 captions an image), the buffer plus two parts of captions (the one
training and the one read ahead), one batch on the device. With ``world_size`` DDP workers
every worker reads every part and keeps the rows whose position in the epoch's part order is
``rank`` modulo ``world_size`` (balanced to one row; the I/O is repeated per worker, the
memory is not).

Every epoch has exactly :func:`~asymvlm.training.steps_per_epoch` steps computed from the row
counts in the parquet footers (the ragged tail is dropped as in the trainer), so DDP workers
agree without reading data.

**Trade-off against the exact permutation** (docs/streaming.md): a shard-order shuffle plus a
local buffer is not a uniform permutation -- captions of one part stay close together in the
epoch, so batches are correlated within a part (in-batch negatives come mostly from the
same few parts) unless ``shuffle_buffer`` spans several parts. Runs are deterministic for a
given (seed, epoch, rank, world size) and part layout, but not bit-identical to in-memory runs.
The method's ``fit_start`` calibration sees the whole image table and a random sample of
``sample_size`` captions (not every caption), and the per-epoch kappa summary uses the first
4096 of that sample. A resumed run restarts the interrupted epoch at its boundary (checkpoints
are written at epoch boundaries only), reproducing the uninterrupted run exactly.

Validation is lighter than :func:`~asymvlm.tables.read_split`: caption ``image_id`` values must
be in the image table and embeddings finite (checked in one pass at start-up, which also draws
the sample); unit norms, duplicate ids and the ``norm`` spread are not checked.

The Ray paths (Tune trials, Ray Train workers) stream with this same reader through
:func:`~asymvlm.protocol.run_protocol`: the stream is part of the training protocol, which runs
without Ray (docs/streaming.md says why it is not Ray Data's ``read_parquet`` /
``iter_torch_batches``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from asymvlm import tables
from asymvlm.errors import ConfigError, NonFiniteError
from asymvlm.methods import METHODS, Method
from asymvlm.splits import SplitTensors
from asymvlm.storage import display, filesystem, join
from asymvlm.training.config import TrainConfig
from asymvlm.training.trainer import Trainer, steps_per_epoch

__all__ = [
    "CaptionStream",
    "StreamingTrainer",
    "memory_budget",
    "open_stream",
    "split_bytes",
    "use_streaming",
]

logger = logging.getLogger(__name__)

#: Share of the free host memory the in-memory mode may take before ``auto`` streams: loading a
#: split peaks at about three copies of its float32 bytes (parquet, numpy, torch).
HOST_SHARE = 0.25
#: Share of the free accelerator memory the resident split may take before ``auto`` streams.
DEVICE_SHARE = 0.5
#: Captions drawn once at start-up for ``fit_start`` and the kappa probe.
SAMPLE_SIZE = 4096


# -- the choice -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartRows:
    """One parquet part file and its row count (from the footer)."""

    path: str
    rows: int


def _parts(root: str, split: str, kind: str) -> list[PartRows]:
    fs, base = filesystem(root)
    folder = join(base, split, kind)
    files = tables.list_parquet(fs, folder)
    if not files:
        raise tables.TableError(f"{display(root, folder)}: no parquet files in this folder")
    out = []
    for path in files:
        with fs.open_input_file(path) as fh:
            out.append(PartRows(path, pq.ParquetFile(fh).metadata.num_rows))
    return out


def split_bytes(root: str, split: str) -> int:
    """The float32 bytes the in-memory mode holds for ``ROOT/<split>``: both embedding matrices
    (and the pre-projection features, which :func:`~asymvlm.splits.load_split` loads too),
    from the manifest and the parquet footers (no data read)."""
    manifest = tables.read_manifest(root)
    fs, _ = filesystem(root)
    total = 0
    for kind, modality in ((tables.IMAGES_DIR, "image"), (tables.TEXTS_DIR, "text")):
        parts = _parts(root, split, kind)
        width = manifest.dim
        with fs.open_input_file(parts[0].path) as fh:
            names = pq.ParquetFile(fh).schema_arrow.names
        if tables.PRE_COLUMNS[modality] in names:
            width += manifest.pre_dim.get(modality, 0)
        total += sum(p.rows for p in parts) * width * 4
    return total


def memory_budget(device: str | torch.device = "cpu") -> int:
    """Default ``stream_memory_bytes``: :data:`HOST_SHARE` of the free host memory (psutil when
    installed, else ``os.sysconf``), and at most :data:`DEVICE_SHARE` of the free memory of a
    CUDA ``device``."""
    try:
        import psutil

        free = int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is a dependency of Ray
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    budget = int(free * HOST_SHARE)
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        free_device, _ = torch.cuda.mem_get_info(device)
        budget = min(budget, int(free_device * DEVICE_SHARE))
    return budget


def use_streaming(
    cfg: TrainConfig, root: str, split: str, device: str | torch.device = "cpu"
) -> bool:
    """Whether a run of ``cfg`` streams ``ROOT/<split>``: ``cfg.stream`` ``always`` / ``never``,
    or (``auto``) when :func:`split_bytes` exceeds ``cfg.stream_memory_bytes`` (None:
    :func:`memory_budget`). Methods not trained by SGD (``clip``, ``bayesvlm``) never stream:
    ``always`` is a :class:`ConfigError` for them, ``auto`` loads them in memory."""
    trainable = METHODS[cfg.method].trainable
    if cfg.stream == "never":
        return False
    if cfg.stream == "always":
        if not trainable:
            raise ConfigError(
                f"stream='always': {cfg.method} is not trained by SGD and needs the whole split "
                "in memory; use stream='auto' or 'never'"
            )
        return True
    if not trainable:
        return False
    size = split_bytes(root, split)
    budget = cfg.stream_memory_bytes
    if budget is None:
        budget = memory_budget(device)
    chosen = size > budget
    if chosen:
        logger.info(
            "streaming %s/%s: %.1f MB of float32 exceed the %.1f MB budget",
            root,
            split,
            size / 1e6,
            budget / 1e6,
        )
    return chosen


# -- the source ------------------------------------------------------------------------------------


@dataclass
class _Chunk:
    """Rows of one caption part: adapter inputs and the resident image row of each."""

    text: np.ndarray  # [n, dim] float32
    image_rows: np.ndarray  # [n] int64


class CaptionStream:
    """A split's captions streamed from its parquet parts, its image table resident.

    ``batch_size`` is the global batch (``min(batch_size, n_text)``, divided by
    ``world_size``: :attr:`batch_size` is this worker's); :attr:`steps` the batches of every
    epoch. :meth:`batches` yields ``(image_rows, text_batch)``: indices into
    :attr:`image_emb` and the captions' adapter inputs (``adapter_input``: ``raw`` =
    ``embedding * norm``, ``unit``), both on ``device``. See the module docstring for the order
    and the memory.
    """

    def __init__(
        self,
        root: str,
        split: str,
        *,
        batch_size: int,
        shuffle_buffer: int = 65536,
        seed: int = 0,
        adapter_input: str = "raw",
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
        sample_size: int = SAMPLE_SIZE,
        read_ahead: bool = True,
    ) -> None:
        if adapter_input not in ("raw", "unit"):
            raise ValueError(f"adapter_input must be 'raw' or 'unit', got {adapter_input!r}")
        self.root, self.split = root, split
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.adapter_input, self.shuffle_buffer = adapter_input, shuffle_buffer
        self.device = torch.device(device)
        self.read_ahead = read_ahead
        self.manifest = tables.read_manifest(root)
        self.dim = self.manifest.dim
        self._fs, _ = filesystem(root)
        self.parts = _parts(root, split, tables.TEXTS_DIR)
        self.n_text = sum(p.rows for p in self.parts)
        self._read_images()
        if self.n_text == 0 or self.n_image == 0:
            raise tables.TableError(
                f"{root}/{split}: the split is empty ({self.n_image} images, {self.n_text} "
                "captions); training needs at least one of each"
            )
        global_batch = min(batch_size, self.n_text)
        if global_batch % world_size:
            raise ValueError(f"batch_size {global_batch} is not divisible by {world_size} workers")
        self.batch_size = global_batch // world_size
        self.steps = steps_per_epoch(self.n_text // world_size, self.batch_size)
        self.sample = self._validate_and_sample(sample_size)

    # -- reading ----------------------------------------------------------------------------------
    def _read_images(self) -> None:
        """The resident image table: ids, unit embeddings and raw norms (when present)."""
        ids, blocks, norms = [], [], []
        for part in _parts(self.root, self.split, tables.IMAGES_DIR):
            names = pq.read_schema(part.path, filesystem=self._fs).names
            columns = ["image_id", "embedding"] + (["norm"] if "norm" in names else [])
            table = pq.read_table(part.path, columns=columns, filesystem=self._fs)
            ids.append(table.column("image_id").combine_chunks().cast(pa.string()))
            blocks.append(tables.column_matrix(table.column("embedding")))
            if "norm" in names:
                norms.append(table.column("norm").to_numpy().astype(np.float32))
        self.image_ids = pa.concat_arrays(ids)
        self.n_image = len(self.image_ids)
        matrix = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
        del blocks
        self.image_emb = torch.from_numpy(matrix).to(self.device)
        self.image_norm = (
            torch.from_numpy(np.concatenate(norms)).to(self.device)
            if norms and len(norms) == len(ids)
            else None
        )

    def _read_part(self, part: PartRows, extra: tuple[str, ...] = ()) -> tuple[_Chunk, pa.Table]:
        """One caption part: adapter inputs, resident image rows, and the ``extra`` columns."""
        names = pq.read_schema(part.path, filesystem=self._fs).names
        raw = self.adapter_input == "raw" and "norm" in names
        columns = ["image_id", "embedding", *(["norm"] if raw else []), *extra]
        table = pq.read_table(part.path, columns=columns, filesystem=self._fs)
        text = tables.column_matrix(table.column("embedding"))
        if raw:
            norm = table.column("norm").to_numpy().astype(np.float32)
            text = text * norm[:, None]
        rows = pc.index_in(table.column("image_id"), value_set=self.image_ids)
        if rows.null_count:
            bad = int(np.flatnonzero(rows.is_null().to_numpy(zero_copy_only=False))[0])
            raise tables.TableError(
                f"{display(self.root, part.path)} row {bad}: unknown image_id "
                f"{table.column('image_id')[bad].as_py()!r}"
            )
        chunk = _Chunk(
            np.ascontiguousarray(text, dtype=np.float32),
            rows.to_numpy(zero_copy_only=False).astype(np.int64),
        )
        return chunk, table.drop_columns([c for c in columns if c not in extra])

    def _validate_and_sample(self, size: int) -> SplitTensors:
        """One pass over the parts: image ids known, embeddings finite; returns the resident
        images with a seeded random sample of about ``size`` captions (all when fewer) --
        what ``fit_start`` and the kappa probe see."""
        if not bool(torch.isfinite(self.image_emb).all()):
            row = int((~torch.isfinite(self.image_emb).all(dim=1)).nonzero()[0, 0])
            raise NonFiniteError(
                f"non-finite image embedding for image {self.image_ids[row].as_py()!r} (row "
                f"{row}) of the training data: fix the input, it is not a training problem"
            )
        rng = np.random.default_rng([self.seed, 0x5A4D])
        keep = min(1.0, size / self.n_text)
        texts, owners, ids, words = [], [], [], []
        for part in self.parts:
            chunk, table = self._read_part(part, extra=("caption_id", "text"))
            finite = np.isfinite(chunk.text).all(axis=1)
            if not finite.all():
                bad = int(np.flatnonzero(~finite)[0])
                raise NonFiniteError(
                    f"non-finite caption embedding for caption "
                    f"{table.column('caption_id')[bad].as_py()!r} (row {bad} of "
                    f"{display(self.root, part.path)}) of the training data: fix the input, it "
                    "is not a training problem"
                )
            take = np.flatnonzero(rng.random(len(chunk.text)) < keep)
            texts.append(chunk.text[take])
            owners.append(chunk.image_rows[take])
            ids.extend(table.column("caption_id").take(take).to_pylist())
            words.extend(table.column("text").take(take).to_pylist())
        text = np.concatenate(texts) if texts else np.zeros((0, self.dim), np.float32)
        owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
        empty = np.zeros((0, self.dim), np.float32)  # the embeddings are held as tensors only
        split = tables.EmbeddingSplit(
            image_ids=self.image_ids.to_pylist(),
            image_embeddings=empty,
            caption_ids=ids,
            text_image_index=owner,
            texts=words,
            text_embeddings=empty,
            text_norms=None,
            extra_text_columns={},
            manifest=self.manifest,
        )
        return SplitTensors(
            image_emb=self.image_emb,
            text_emb=torch.from_numpy(text).to(self.device),
            text_to_image=torch.from_numpy(owner).to(self.device),
            split=split,
            image_norm=self.image_norm,
        )

    # -- the epoch --------------------------------------------------------------------------------
    def part_order(self, epoch: int) -> list[int]:
        """The epoch's part order: a permutation drawn from ``(seed, epoch)``, the same on every
        worker."""
        rng = np.random.default_rng([self.seed, epoch, 0x0DE5])
        return [int(k) for k in rng.permutation(len(self.parts))]

    def _chunks(self, epoch: int) -> Iterator[_Chunk]:
        """This worker's rows of every part in the epoch's order (the next part read ahead)."""
        order = self.part_order(epoch)
        pool = ThreadPoolExecutor(max_workers=1) if self.read_ahead else None
        offset = 0

        def read(k: int) -> Future | _Chunk:
            part = self.parts[k]
            if pool is None:
                return self._read_part(part)[0]
            return pool.submit(lambda: self._read_part(part)[0])

        try:
            pending = read(order[0]) if order else None
            for i in range(len(order)):
                current = pending
                pending = read(order[i + 1]) if i + 1 < len(order) else None
                chunk = current.result() if isinstance(current, Future) else current
                assert chunk is not None
                n = len(chunk.text)
                if self.world_size > 1:
                    mine = np.flatnonzero((offset + np.arange(n)) % self.world_size == self.rank)
                    chunk = _Chunk(chunk.text[mine], chunk.image_rows[mine])
                offset += n
                yield chunk
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def rows(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The epoch's (text rows, image rows) in batches of :attr:`batch_size` as numpy, all
        of this worker's rows but the ragged tail, through the shuffle buffer."""
        rng = np.random.default_rng([self.seed, epoch, self.rank, 0xB0F])
        b = self.batch_size
        carry = _Chunk(np.zeros((0, self.dim), np.float32), np.zeros(0, np.int64))
        for chunk in self._chunks(epoch):
            text = np.concatenate([carry.text, chunk.text])
            image = np.concatenate([carry.image_rows, chunk.image_rows])
            del chunk
            perm = rng.permutation(len(text))
            leave = max(0, (len(text) - self.shuffle_buffer) // b * b)
            for start in range(0, leave, b):
                idx = perm[start : start + b]
                yield text[idx], image[idx]
            rest = perm[leave:]
            carry = _Chunk(text[rest], image[rest])
        perm = rng.permutation(len(carry.text))
        for start in range(0, len(perm) - b + 1, b):
            idx = perm[start : start + b]
            yield carry.text[idx], carry.image_rows[idx]

    def batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Exactly :attr:`steps` ``(image_rows, text_batch)`` tensors on the device."""
        produced = 0
        rows = self.rows(epoch)
        try:
            for text, image in rows:
                if produced == self.steps:
                    break
                produced += 1
                yield (
                    torch.from_numpy(image).to(self.device, non_blocking=True),
                    torch.from_numpy(text).to(self.device, non_blocking=True),
                )
        finally:
            rows.close()
        if produced < self.steps:  # pragma: no cover - the counts come from the same footers
            raise RuntimeError(f"the stream gave {produced} batches, expected {self.steps}")


# -- the trainer -----------------------------------------------------------------------------------


class StreamingTrainer(Trainer):
    """:class:`Trainer` over a :class:`CaptionStream` instead of a split in memory.

    Everything but the batches is the trainer's: the optimiser, the cosine schedule stepped
    per iteration over ``epochs * stream.steps`` steps, the per-step and per-epoch non-finite
    checks, :meth:`state_dict` / :meth:`load_state_dict` (a resumed run restarts the
    interrupted epoch at its boundary), the per-epoch statistics. The trainer's ``data`` is
    :attr:`CaptionStream.sample`: the resident image table with a random sample of captions,
    on which :meth:`start` calls the method's ``fit_start`` (the calibration of the input
    scales: exact on the images, estimated from the sample on the captions) and from which
    the kappa probe is taken. With ``world_size`` > 1 each worker streams its rows of every
    part (:class:`CaptionStream`), the global batch split as in the trainer.
    """

    def __init__(
        self,
        method: Method,
        cfg: TrainConfig,
        stream: CaptionStream,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not method.trainable:
            raise ConfigError(f"{method.name} is not trained by SGD; it cannot stream")
        if (stream.rank, stream.world_size) != (rank, world_size):
            raise ValueError("the stream belongs to another worker")
        # The sample stands in for the split; its size must not bound the batch.
        sample_cfg = cfg.model_copy(update={"batch_size": world_size})
        super().__init__(method, sample_cfg, stream.sample, rank=rank, world_size=world_size)
        self.cfg, self.stream = cfg, stream
        self.batch_size, self.steps = stream.batch_size, stream.steps
        if self.optimizer is not None:  # the schedule spans the stream's steps, not the sample's
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, T_max=max(1, cfg.epochs * self.steps), eta_min=cfg.min_lr
            )

    def epoch_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's batches from the stream, paired with the resident (method-specific)
        image rows."""
        for image_rows, text_batch in self.stream.batches(self.epoch):
            yield self.data.image_emb[image_rows], text_batch


def open_stream(
    cfg: TrainConfig,
    root: str,
    split: str,
    *,
    rank: int = 0,
    world_size: int = 1,
    device: str | torch.device = "cpu",
) -> CaptionStream | None:
    """The :class:`CaptionStream` of a run when it streams (:func:`use_streaming`), else None."""
    if not use_streaming(cfg, root, split, device):
        return None
    return CaptionStream(
        root,
        split,
        batch_size=cfg.batch_size,
        shuffle_buffer=cfg.shuffle_buffer,
        seed=cfg.seed,
        adapter_input=cfg.adapter_input,
        rank=rank,
        world_size=world_size,
        device=device,
    )
