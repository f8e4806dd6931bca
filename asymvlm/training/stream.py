"""Training on tables bigger than memory (docs/streaming.md): the image table stays resident, the
captions stream from the parquet parts (``pyarrow.dataset`` fragments, read ahead by pyarrow) in
a ``(seed, epoch)`` part order through a shuffle buffer, each paired with its image by id."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import torch

from asymvlm import tables
from asymvlm.errors import ConfigError, NonFiniteError
from asymvlm.methods import METHODS, Method
from asymvlm.splits import SplitTensors
from asymvlm.storage import display, filesystem, join
from asymvlm.training.trainer import TrainConfig, Trainer, layout

logger = logging.getLogger(__name__)

#: Captions drawn once at start-up for ``fit_start`` and the kappa probe.
SAMPLE_SIZE = 4096


def _dataset(root: str, split: str, kind: str) -> ds.FileSystemDataset:
    fs, base = filesystem(root)
    folder = join(base, split, kind)
    files = tables.list_parquet(fs, folder)
    if not files:
        tables.check_split(root, split)
        raise tables.TableError(f"{display(root, folder)}: no parquet files in this folder")
    try:
        return ds.dataset(files, filesystem=fs, format="parquet")
    except (OSError, pa.ArrowInvalid) as exc:  # a half-written or foreign file: it names it
        raise tables.TableError(f"{display(root, folder)}: cannot read ({exc})") from None


def table_input(cfg: TrainConfig, root: str, split: str) -> TrainConfig:
    """``cfg`` with the adapter input ``ROOT/<split>`` can give: a text table without ``norm``
    trains (and is recorded) as ``unit``, said at WARNING; an explicit ``raw`` is refused."""
    tables.check_split(root, split)  # a bad root or split: said here, before any warning
    texts = _dataset(root, split, tables.TEXTS_DIR)
    if cfg.adapter_input == "unit" or "norm" in texts.schema.names:
        return cfg
    where = display(root, join(filesystem(root)[1], split, tables.TEXTS_DIR))
    if "adapter_input" in cfg.model_fields_set:
        raise ConfigError(
            f"{where}: no `norm` column, so adapter_input raw (embedding x norm) cannot be "
            "made: use --adapter-input unit (adapter_input: unit), or add the column"
        )
    logger.warning(
        f"{where} has no `norm` column: training on unit text embeddings (adapter_input unit, "
        "recorded in the checkpoint)"
    )
    return cfg.model_copy(update={"adapter_input": "unit"})


def split_bytes(root: str, split: str) -> int:
    """The float32 bytes the in-memory mode holds for ``ROOT/<split>`` (embeddings and the
    pre-projection features), from the manifest and the parquet footers."""
    manifest, total = tables.read_manifest(root), 0
    for kind, modality in ((tables.IMAGES_DIR, "image"), (tables.TEXTS_DIR, "text")):
        data = _dataset(root, split, kind)
        pre = tables.PRE_COLUMNS[modality] in data.schema.names
        total += data.count_rows() * (manifest.dim + pre * manifest.pre_dim.get(modality, 0)) * 4
    return total


def use_streaming(
    cfg: TrainConfig, root: str, split: str, device: str | torch.device = "cpu"
) -> bool:
    """Whether a run of ``cfg`` streams ``ROOT/<split>`` (``stream``: always, never, or auto: above
    ``stream_memory_bytes``, docs/streaming.md); methods not trained by SGD never stream."""
    trainable = METHODS[cfg.method].trainable
    if cfg.stream == "always" and not trainable:
        raise ConfigError(
            f"stream='always': {cfg.method} is not trained by SGD and needs the whole split "
            "in memory; use stream='auto' or 'never'"
        )
    if cfg.stream != "auto" or not trainable:
        return cfg.stream == "always"
    budget = cfg.stream_memory_bytes
    if budget is None:
        budget = psutil.virtual_memory().available // 4
        if (device := torch.device(device)).type == "cuda" and torch.cuda.is_available():
            budget = min(budget, torch.cuda.mem_get_info(device)[0] // 2)
    size = split_bytes(root, split)
    if size > budget:
        logger.info("streaming %s/%s: %.1f MB over %.1f MB", root, split, size / 1e6, budget / 1e6)
    return size > budget


class CaptionStream:
    """A split's captions streamed from its parquet parts, its image table resident; with
    ``world_size`` workers each keeps every ``world_size``-th row of the epoch."""

    def __init__(
        self,
        root: str,
        split: str,
        cfg: TrainConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
    ) -> None:
        self.root = root
        self.split = split
        self.seed = cfg.seed
        self.rank = rank
        self.world_size = world_size
        self.shuffle_buffer = cfg.shuffle_buffer
        self.device = torch.device(device)
        self.manifest = tables.read_manifest(root)
        self.dim = self.manifest.dim
        images = _dataset(root, split, tables.IMAGES_DIR)
        has_norm = "norm" in images.schema.names
        table = images.to_table(columns=["image_id", "embedding"] + ["norm"] * has_norm)
        self.image_ids = table.column("image_id").combine_chunks().cast(pa.string())
        self.n_image = len(self.image_ids)
        self.image_emb = torch.from_numpy(tables.column_matrix(table.column("embedding")))
        self.image_emb = self.image_emb.to(self.device)
        norm = table.column("norm").to_numpy().astype(np.float32) if has_norm else None
        self.image_norm = None if norm is None else torch.from_numpy(norm).to(self.device)
        texts = _dataset(root, split, tables.TEXTS_DIR)
        self.parts = list(texts.get_fragments())
        self.n_text = texts.count_rows()
        if self.n_text == 0 or self.n_image == 0:
            raise tables.TableError(
                f"{root}/{split}: the split is empty ({self.n_image} images, {self.n_text} "
                "captions); training needs at least one of each"
            )
        raw = cfg.adapter_input == "raw" and "norm" in texts.schema.names
        self._columns = ["image_id", "embedding"] + ["norm"] * raw
        self.batch_size, self.steps = layout(self.n_text, cfg.batch_size, world_size)
        self.sample = self._validate_and_sample(SAMPLE_SIZE)

    def _arrays(self, batch: pa.RecordBatch, where: str, offset: int) -> tuple[np.ndarray, ...]:
        """A record batch's adapter inputs and resident image rows (for errors: part, offset)."""
        text = tables.column_matrix(batch.column("embedding"))
        if "norm" in self._columns:
            text = text * batch.column("norm").to_numpy().astype(np.float32)[:, None]
        rows = pc.index_in(batch.column("image_id"), value_set=self.image_ids)
        if rows.null_count:
            bad = int(np.flatnonzero(rows.is_null().to_numpy(zero_copy_only=False))[0])
            raise tables.TableError(
                f"{where} row {offset + bad}: unknown image_id "
                f"{batch.column('image_id')[bad].as_py()!r}"
            )
        return np.ascontiguousarray(text, dtype=np.float32), rows.to_numpy().astype(np.int64)

    def _validate_and_sample(self, size: int) -> SplitTensors:
        """One pass over the captions: image ids known, embeddings finite (the trainer checks
        the images); the resident images with a seeded sample of about ``size`` captions."""
        rng = np.random.default_rng([self.seed, 0x5A4D])
        keep = min(1.0, size / self.n_text)
        texts, owners, ids = [], [], []
        for part in self.parts:
            where, offset = display(self.root, part.path), 0
            for batch in part.to_batches(columns=[*self._columns, "caption_id"]):
                text, owner = self._arrays(batch, where, offset)
                if len(bad := np.flatnonzero(~np.isfinite(text).all(axis=1))):
                    raise NonFiniteError(
                        "non-finite caption embedding for caption "
                        f"{batch.column('caption_id')[bad[0]].as_py()!r} (row {offset + bad[0]} of "
                        f"{where}) of the training data: fix the input, it is not a training "
                        "problem"
                    )
                take = np.flatnonzero(rng.random(len(text)) < keep)
                texts.append(text[take])
                owners.append(owner[take])
                ids.extend(batch.column("caption_id").take(take).to_pylist())
                offset += len(text)
        empty = np.zeros((0, self.dim), np.float32)  # the sample's embeddings live as tensors
        split = tables.EmbeddingSplit(
            image_ids=self.image_ids.to_pylist(),
            image_embeddings=empty,
            caption_ids=ids,
            text_image_index=np.concatenate(owners),
            texts=[""] * len(ids),
            text_embeddings=empty,
            text_norms=None,
            extra_text_columns={},
            manifest=self.manifest,
            fingerprint=tables.fingerprint(
                self.root, self.split, self.manifest, self.n_image, self.n_text
            ),
        )
        return SplitTensors(
            image_emb=self.image_emb,
            text_emb=torch.from_numpy(np.concatenate(texts)).to(self.device),
            text_to_image=torch.from_numpy(np.concatenate(owners)).to(self.device),
            split=split,
            image_norm=self.image_norm,
        )

    def part_order(self, epoch: int) -> list[int]:
        """The epoch's part order, the same on every worker."""
        return np.random.default_rng([self.seed, epoch, 0x0DE5]).permutation(len(self.parts))

    def rows(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """This worker's (text, image rows) batches of the epoch: record batches of the parts in
        :meth:`part_order`, each mixed with ``shuffle_buffer`` rows carried over."""
        rng = np.random.default_rng([self.seed, epoch, self.rank, 0xB0F])
        b, offset = self.batch_size, 0
        carry = np.zeros((0, self.dim), np.float32), np.zeros(0, np.int64)
        chunk_rows = max(b, self.shuffle_buffer)
        for k in self.part_order(epoch):
            for batch in self.parts[k].to_batches(columns=self._columns, batch_size=chunk_rows):
                text, owner = self._arrays(batch, "", 0)
                mine = (offset + np.arange(len(text))) % self.world_size == self.rank
                offset += len(text)
                text = np.concatenate([carry[0], text[mine]])
                owner = np.concatenate([carry[1], owner[mine]])
                perm = rng.permutation(len(text))
                leave = max(0, (len(text) - self.shuffle_buffer) // b * b)
                for start in range(0, leave, b):
                    yield text[perm[start : start + b]], owner[perm[start : start + b]]
                carry = text[perm[leave:]], owner[perm[leave:]]
        perm = rng.permutation(len(carry[0]))
        for start in range(0, len(perm) - b + 1, b):
            yield carry[0][perm[start : start + b]], carry[1][perm[start : start + b]]

    def batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Exactly :attr:`steps` ``(image_rows, text_batch)`` tensors on the device."""
        for text, owner in itertools.islice(self.rows(epoch), self.steps):
            yield (
                torch.from_numpy(owner).to(self.device, non_blocking=True),
                torch.from_numpy(text).to(self.device, non_blocking=True),
            )


class StreamingTrainer(Trainer):
    """:class:`Trainer` over a :class:`CaptionStream`: its ``data`` is the stream's sample
    (``fit_start``, kappa probe), its batches and steps are the stream's."""

    def __init__(self, method: Method, cfg: TrainConfig, stream: CaptionStream) -> None:
        if method.trainable and type(method).split_inputs is not Method.split_inputs:
            raise ConfigError(
                f"{method.name} reads per-caption inputs (split_inputs) that a streamed split "
                "does not carry: train it with stream='never'"
            )
        self.stream, rank, world_size = stream, stream.rank, stream.world_size
        super().__init__(method, cfg, stream.sample, rank=rank, world_size=world_size)

    def _layout(self, n_text: int) -> tuple[int, int]:
        return self.stream.batch_size, self.stream.steps

    def epoch_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for image_rows, text_batch in self.stream.batches(self.epoch):
            yield self.data.image_emb[image_rows], text_batch


def open_stream(
    cfg: TrainConfig, root: str, split: str, *, rank: int = 0, world_size: int = 1, device="cpu"
) -> CaptionStream | None:
    """The :class:`CaptionStream` of a run when it streams (:func:`use_streaming`), else None."""
    if not use_streaming(cfg, root, split, device):
        return None
    return CaptionStream(root, split, cfg, rank=rank, world_size=world_size, device=device)
