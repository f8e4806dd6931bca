"""Row-level work of the embedding stage: decode images, embed images and captions."""

from __future__ import annotations

import functools
import io
import json
from typing import Any

import numpy as np
import pyarrow as pa

from asymvlm.data.perturb import item_seed, perturb_caption, perturb_image
from asymvlm.data.sources import open_fs
from asymvlm.embedding.encoders import load_encoder


@functools.lru_cache(maxsize=4)
def _preprocessor(model: str):
    """Processor-only encoder (no weights), cached per worker process."""
    return load_encoder(model, device="cpu", load_model=False)


def load_image(row: dict[str, Any]):
    """The RGB image of a row: its bytes (``data``), or those at ``path`` (any filesystem;
    ``offset``/``length`` for a member of a tar shard). Raises on files that do not decode."""
    from PIL import Image

    data = row.get("data")
    if data is None:
        fs, path = open_fs(row["path"])
        with fs.open(path, "rb") as handle:
            handle.seek(int(row.get("offset") or 0))
            data = handle.read(-1 if row.get("length") is None else int(row["length"]))
    image = Image.open(io.BytesIO(data))
    image.load()  # raises on truncated files
    return image.convert("RGB")


def decode_batch(
    batch: pa.Table, model: str, perturbation: str | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Read, decode (perturb) and preprocess image rows; failures become ``error`` strings."""
    preprocessor = _preprocessor(model)
    rows = batch.to_pylist()
    images, errors = [], []
    for row in rows:
        try:
            image = load_image(row)
            if perturbation:
                image = perturb_image(image, perturbation, item_seed(seed, row["image_id"]))
            images.append(image)
            errors.append("")
        except Exception as exc:  # any unreadable image is data, not a crash
            errors.append(f"{type(exc).__name__}: {exc}")
    size = preprocessor.image_size
    pixels = np.zeros((len(rows), 3, size, size), dtype=np.float32)
    pixels[np.array(errors) == ""] = preprocessor.preprocess_images(images)
    return {
        "image_id": np.array([r["image_id"] for r in rows], dtype=object),
        "path": np.array([r.get("path") or "" for r in rows], dtype=object),
        "shard": np.array([r["shard"] for r in rows], dtype=np.int64),
        "pixel_values": pixels,
        "error": np.array(errors, dtype=object),
        "captions": np.array([r.get("captions") or "[]" for r in rows], dtype=object),
    }


class EncoderActor:
    """The frozen encoder as a Ray Data actor: decoded images and their captions (JSON
    ``[[caption_id, text], ...]``) -> "image" and "caption" rows; a text-only batch -> its rows."""

    def __init__(
        self,
        model: str,
        device: str,
        dtype: str,
        threads: int | None = None,
        text_batch_size: int = 256,
        pre_projection: bool = False,
    ) -> None:
        import torch

        if threads:  # Ray pins OMP threads to the actor's num_cpus; on CPU-only nodes use the node
            torch.set_num_threads(threads)
        self.encoder = load_encoder(model, device=device, dtype=dtype)
        self.text_batch_size = text_batch_size
        self.pre = pre_projection

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "pixel_values" not in batch:
            texts = [str(t) for t in batch["text"]]
            emb, norm = encode_texts_by_length(self.encoder, texts, self.text_batch_size)
            return {"caption_id": batch["caption_id"], "embedding": emb, "norm": norm}
        ok = batch["error"] == ""
        encoded = self.encoder.encode_pixels(batch["pixel_values"][ok], pre=self.pre)
        image = [np.zeros((len(ok), *a.shape[1:]), np.float32) for a in encoded]
        for target, value in zip(image, encoded, strict=True):
            target[ok] = value
        riding = [
            (caption_id, image_id, text)
            for image_id, captions in zip(batch["image_id"][ok], batch["captions"][ok], strict=True)
            for caption_id, text in json.loads(captions)
        ]
        columns = zip(*riding, strict=True) if riding else ([], [], [])
        ids, images, texts = (np.array(c, dtype=object) for c in columns)
        text = encode_texts_by_length(self.encoder, list(texts), self.text_batch_size, self.pre)
        n, m = len(ok), len(ids)
        out = {
            "kind": np.array(["image"] * n + ["caption"] * m, dtype=object),
            "id": np.concatenate([batch["image_id"], ids]),
            "image_id": np.concatenate([batch["image_id"], images]),
            "path": np.concatenate([batch["path"], np.full(m, "", dtype=object)]),
            "shard": np.concatenate([batch["shard"], np.full(m, -1, dtype=np.int64)]),
            "embedding": np.concatenate([image[0], text[0]]),
            "norm": np.concatenate([image[1], text[1]]),
            "error": np.concatenate([batch["error"], np.full(m, "", dtype=object)]),
        }
        if self.pre:
            out["image_pre"] = np.concatenate([image[2], np.zeros((m, image[2].shape[1]), "f4")])
            out["text_pre"] = np.concatenate([np.zeros((n, text[2].shape[1]), "f4"), text[2]])
        return out


def encode_texts_by_length(
    encoder, texts: list[str], batch_size: int, pre: bool = False
) -> tuple[np.ndarray, ...]:
    """``encoder.encode_texts`` over chunks sorted by token count (less padding), in input order."""
    lengths = encoder.token_lengths(texts) if texts else []
    order = np.argsort(np.asarray(lengths, np.int64), kind="stable")
    chunks = [
        encoder.encode_texts([texts[i] for i in order[start : start + batch_size]], pre=pre)
        for start in range(0, len(texts), batch_size)
    ] or [encoder.encode_texts([], pre=pre)]
    inverse = np.argsort(order)
    return tuple(np.concatenate(parts)[inverse] for parts in zip(*chunks, strict=True))


def perturb_captions(captions: pa.Table, spec: str, seed: int) -> pa.Table:
    """``text`` replaced by its perturbed version; the original is kept as ``clean_text``."""
    clean = captions["text"].to_pylist()
    noisy = [
        perturb_caption(text or "", spec, item_seed(seed, cid))
        for text, cid in zip(clean, captions["caption_id"].to_pylist(), strict=True)
    ]
    text = captions.column_names.index("text")
    captions = captions.set_column(text, "text", pa.array(noisy, pa.string()))
    return captions.append_column("clean_text", pa.array(clean, pa.string()))
