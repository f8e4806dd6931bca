"""Text in, uncertainty out: :class:`Scorer`, a trained adapter with the frozen encoder its
checkpoint names, giving a caption the numbers ``asymvlm score`` gives it in a table."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from asymvlm import logs
from asymvlm.checkpoints import load_checkpoint, resolve_checkpoint
from asymvlm.data.tiny import is_random_test_model
from asymvlm.embedding.encoders import files_sha256, load_encoder, local_source
from asymvlm.embedding.encoders.hub import check_hub_model
from asymvlm.embedding.encoding import load_image
from asymvlm.errors import AsymVLMError, CheckpointError
from asymvlm.splits import SplitTensors
from asymvlm.tables import read_split

logger = logging.getLogger(__name__)


class ScoringInputError(AsymVLMError, ValueError):
    """A caption or an image the scorer cannot take: ``"<kind> <index>: <problem>"``."""

    def __init__(self, kind: str, index: int, problem: str) -> None:
        super().__init__(f"{kind} {index}: {problem}")
        self.kind = kind
        self.index = index
        self.problem = problem


@dataclass
class CaptionScores:
    """Per caption: the uncertainty, kappa (None where the method has none) and ``mu`` [n, d]."""

    text: list[str]
    uncertainty: np.ndarray | None
    kappa: np.ndarray | None
    mu: np.ndarray

    def records(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per caption: ``text``, ``kappa`` (where defined), ``uncertainty``."""
        return self.table().drop_columns([] if self.kappa is not None else ["kappa"]).to_pylist()

    def table(self) -> pa.Table:
        """``text``, ``kappa`` and ``uncertainty`` columns (null where undefined)."""
        numbers = {"kappa": self.kappa, "uncertainty": self.uncertainty}
        none = pa.nulls(len(self.text), pa.float32())
        columns = {k: none if v is None else pa.array(v, pa.float32()) for k, v in numbers.items()}
        return pa.table({"text": pa.array(self.text, pa.string()), **columns})


class TableEncoder:
    """An encoder for tables that have none (synthetic worlds): a caption's (unit embedding, raw
    norm) looked up by text in ``splits`` of the tables at ``root`` (first row wins)."""

    def __init__(self, root: str, splits: Sequence[str] = ("test",), device: str = "cpu") -> None:
        self._rows: dict[str, tuple[np.ndarray, float]] = {}
        for name in splits:
            split = read_split(root, name)
            norms = split.text_norms if split.text_norms is not None else [1.0] * len(split.texts)
            for text, unit, norm in zip(split.texts, split.text_embeddings, norms, strict=True):
                self._rows.setdefault(text, (unit, float(norm)))
            self.dim = int(split.manifest.dim)
        self.device = torch.device(device)
        self.info = SimpleNamespace(model=f"tables:{root}")

    def captions(self) -> list[str]:
        """Every caption it can embed, in table order."""
        return list(self._rows)

    def encode_texts(self, texts: list[str], pre: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(unit embeddings [n, dim], raw norms [n]) of ``texts``, from the tables."""
        if pre:
            raise ValueError("a TableEncoder has no pre-projection features")
        for i, text in enumerate(texts):
            if text not in self._rows:
                raise ScoringInputError("caption", i, f"{text!r} is not in the tables")
        unit = np.asarray([self._rows[t][0] for t in texts], np.float32).reshape(-1, self.dim)
        return unit, np.asarray([self._rows[t][1] for t in texts], np.float32)

    def projections(self) -> dict[str, np.ndarray]:
        return {}


class GivenEmbeddings:
    """The encoder of captions that come embedded (a pool's text embeddings): the adapter's
    dimension, on a device; it embeds nothing itself."""

    def __init__(self, dim: int, device: str = "cpu") -> None:
        self.dim = int(dim)
        self.device = torch.device(device)
        self.info = SimpleNamespace(model="given embeddings")

    def encode_texts(self, texts: list[str], pre: bool = False) -> tuple[np.ndarray, np.ndarray]:
        raise CheckpointError("these captions come embedded: there is no encoder to embed text")

    def projections(self) -> dict[str, np.ndarray]:
        return {}


class Scorer:
    """A trained adapter with its frozen encoder, on its device (:meth:`from_checkpoint`)."""

    def __init__(self, method: Any, meta: dict[str, Any], encoder: Any, batch_size: int = 256):
        if int(encoder.dim) != int(meta["dim"]):
            raise CheckpointError(
                f"the encoder {encoder.info.model!r} embeds in {encoder.dim} dimensions, the "
                f"adapter ({meta['method']}) takes {meta['dim']}"
            )
        self.method = method.eval()
        self.meta = meta
        self.encoder = encoder
        self.batch_size = int(batch_size)
        self.device = encoder.device
        self.method.to(self.device)
        self.raw_text = meta.get("adapter_input", "raw") == "raw"
        self.uses_pre = bool(getattr(method, "USES_PRE_FEATURES", False))
        self.projections = {
            f"{m}_projection": torch.from_numpy(w).to(self.device)
            for m, w in (encoder.projections().items() if self.uses_pre else ())
        }

    @classmethod
    def from_pretrained(cls, name: str, **kwargs: Any) -> Scorer:
        """:meth:`from_checkpoint` of a model folder or Hub repository (no pickle in it)."""
        return cls.from_checkpoint(name, pretrained=True, **kwargs)

    @classmethod
    def from_checkpoint(
        cls,
        source: str,
        *,
        encoder: Any = None,
        device: str = "auto",
        batch_size: int = 256,
        tracking_uri: str | None = None,
        pretrained: bool = False,
    ) -> Scorer:
        """The adapter of ``source`` with the encoder its checkpoint names, or ``encoder``."""
        folder = resolve_checkpoint(source, tracking_uri, pretrained=pretrained)
        method, meta = load_checkpoint(folder, "cpu")
        if encoder is not None and not isinstance(encoder, str):  # an encoder, already loaded
            return cls(method, meta, encoder, batch_size=batch_size)
        recorded = meta.get("encoder") or {}
        name = encoder or recorded.get("model") or meta.get("embedding_model")
        if not name or name == "synthetic-world":  # tables, not an encoder
            what = name or "no model recorded"
            raise CheckpointError(
                f"{source}: the adapter was trained on tables without an encoder ({what}): "
                "give the encoder to embed captions with (--encoder)"
            )
        try:
            files = local_source(name)
        except ValueError as err:  # a malformed open_clip name
            raise CheckpointError(f"{source}: {err}") from None
        if files is not None and not os.path.exists(files):
            raise CheckpointError(
                f"{source}: the encoder files {files} the tables were embedded with are not "
                "here: give their new place (--encoder)"
            )
        sha = recorded.get("files_sha256")
        if files is not None and sha and not encoder and files_sha256(files) != sha:
            raise CheckpointError(
                f"{source}: the encoder files {files} differ from the ones the tables were "
                "embedded with; give --encoder to use them anyway"
            )
        try:  # a Hub model neither cached nor to be had: said at once, not after retries
            check_hub_model(name, "--encoder (encoder= in Python)")
        except ValueError as err:
            raise CheckpointError(f"{source}: the encoder {err}") from None
        if is_random_test_model(files):
            logger.warning("the encoder %s is a random test model: its scores mean nothing", name)
        revision = recorded.get("revision") if not encoder else None
        with logs.quiet_transformers():
            loaded = load_encoder(name, device=device, dtype="float32", revision=revision)
        return cls(method, meta, loaded, batch_size=batch_size)

    def _check_captions(self, captions: Sequence[str]) -> list[str]:
        captions = [captions] if isinstance(captions, str) else list(captions)
        for i, text in enumerate(captions):
            if not isinstance(text, str) or not text.strip():
                what = "empty" if isinstance(text, str) else f"not a string ({type(text).__name__})"
                raise ScoringInputError("caption", i, what)
        return captions

    def _embed(self, items: list, encode) -> dict[str, torch.Tensor]:
        """``encode`` over batches of ``items``: (unit, norm[, pre]) joined, on the device."""
        parts = []
        for start in range(0, len(items), self.batch_size):
            try:
                parts.append(encode(items[start : start + self.batch_size]))
            except ScoringInputError as e:
                raise ScoringInputError(e.kind, e.index + start, e.problem) from None
        columns = [
            torch.from_numpy(np.concatenate(c)).to(self.device) for c in zip(*parts, strict=True)
        ]
        return dict(zip(("unit", "norm", "pre"), columns, strict=False))

    def embed_images(self, images: list) -> dict[str, torch.Tensor]:
        """Images (PIL images, paths or bytes) embedded by the frozen encoder: ``unit``,
        ``norm`` (and ``pre``) on the device."""

        def encode(batch: list) -> tuple[np.ndarray, ...]:
            opened = [_open_image(im, i) for i, im in enumerate(batch)]
            pixels = self.encoder.preprocess_images(opened)
            return self.encoder.encode_pixels(pixels, pre=self.uses_pre)

        return self._embed(images, encode)

    def caption_uncertainty(self, captions: Sequence[str]) -> CaptionScores:
        """κ, uncertainty and μ of each caption (in order)."""
        captions = self._check_captions(captions)
        if not captions:
            empty = np.zeros((0, int(self.meta["dim"])), np.float32)
            return CaptionScores([], None, None, empty)
        return self._caption_scores(captions, self._embed_captions(captions))

    def caption_split(self, captions: Sequence[str]) -> SplitTensors:
        """The captions embedded by the frozen encoder, as a split whose rows each method
        takes (``method.split_inputs``)."""
        captions = self._check_captions(captions)
        return self._split(captions, self._embed_captions(captions))

    def _embed_captions(self, captions: list[str]) -> dict[str, torch.Tensor]:
        return self._embed(captions, partial(self.encoder.encode_texts, pre=self.uses_pre))

    def embedding_uncertainty(
        self, unit: np.ndarray, norm: np.ndarray | None = None, captions: Sequence[str] = ()
    ) -> CaptionScores:
        """:meth:`caption_uncertainty` of captions embedded already: their unit embeddings
        [n, d] and the encoder's raw norms [n] (1 where not given)."""
        unit_rows = torch.from_numpy(np.asarray(unit, np.float32)).to(self.device)
        if unit_rows.ndim != 2 or unit_rows.shape[1] != int(self.meta["dim"]):
            raise CheckpointError(
                f"embeddings of shape {tuple(unit_rows.shape)}: the adapter "
                f"({self.meta['method']}) takes {self.meta['dim']} dimensions"
            )
        norms = np.ones(len(unit_rows), np.float32) if norm is None else norm
        texts = {"unit": unit_rows, "norm": torch.from_numpy(np.asarray(norms, np.float32))}
        texts["norm"] = texts["norm"].to(self.device)
        return self._caption_scores(list(captions) or [""] * len(unit_rows), texts)

    def _caption_scores(self, captions: list[str], texts: dict[str, torch.Tensor]) -> CaptionScores:
        """The adapter on embedded captions (``unit``, ``norm``[, ``pre``])."""
        _, text_rows = self.method.split_inputs(self._split(captions, texts))
        with torch.no_grad():
            encoded = self.method.encode_texts(text_rows)
            unc = self.method.text_uncertainty_from(encoded)
        numbers = {"uncertainty": unc, "kappa": encoded.get("kappa")}
        for name, value in numbers.items():
            numbers[name] = None if value is None else value.float().cpu().numpy()
            if value is not None and not torch.isfinite(value).all():
                bad = int(torch.nonzero(~torch.isfinite(value))[0])
                raise ScoringInputError(
                    "caption", bad, f"the adapter gives a non-finite {name} for {captions[bad]!r}"
                )
        return CaptionScores(captions, mu=encoded["mu"].float().cpu().numpy(), **numbers)

    def score(self, images: Sequence[Any], captions: Sequence[str]) -> np.ndarray:
        """[n_captions, n_images] retrieval scores (the log-likelihood for AsymVLM, App. A.2)."""
        captions = self._check_captions(captions)
        images = list(images)
        if not captions or not images:
            return np.zeros((len(captions), len(images)), np.float32)
        split = self._split(captions, self._embed_captions(captions), images)
        image_rows, text_rows = self.method.split_inputs(split)
        with torch.no_grad():
            texts = self.method.encode_texts(text_rows)
            scores = self.method.score(texts, self.method.encode_images(image_rows))
        return scores.float().cpu().numpy()

    def _split(
        self, captions: list[str], texts: dict[str, torch.Tensor], images: list | None = None
    ) -> SplitTensors:
        """The embedded captions (and the images) as a split, whose rows each method takes."""
        if images is None:  # captions only
            image = {"unit": torch.zeros(0, int(self.meta["dim"]), device=self.device)}
            image["norm"] = torch.zeros(0, device=self.device)
            if self.uses_pre:
                image["pre"] = torch.zeros(0, self.encoder.pre_dims()["image"], device=self.device)
        else:
            image = self.embed_images(images)
        n_text = texts["unit"].shape[0]
        return SplitTensors(
            image_emb=image["unit"],
            text_emb=texts["unit"] * texts["norm"][:, None] if self.raw_text else texts["unit"],
            text_to_image=torch.zeros(n_text, dtype=torch.long, device=self.device),
            split=None,
            image_norm=image["norm"],
            image_pre=image.get("pre"),
            text_pre=texts.get("pre"),
            captions=captions,
            **self.projections,
        )


def _open_image(image: Any, index: int):
    """A PIL image from a PIL image, a path or bytes, decoded as the embedding stage decodes."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, bytes | bytearray):
        row = {"data": bytes(image)}
    elif isinstance(image, str | os.PathLike):
        row = {"path": os.fspath(image)}
    else:
        raise ScoringInputError(
            "image", index, f"give a PIL image, a path or bytes, not {type(image).__name__}"
        )
    try:
        return load_image(row)
    except OSError as exc:  # PIL's UnidentifiedImageError too
        raise ScoringInputError("image", index, f"cannot be decoded ({exc})") from None
