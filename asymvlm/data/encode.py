"""Row-level work of the embedding stage (run inside Ray Data tasks and actors): decode images,
embed images and captions with the frozen encoder.
"""

from __future__ import annotations

import functools
import io
import json
from typing import Any

import numpy as np
import pyarrow as pa

from asymvlm.data.sources import open_fs


# -- per-row work (plain Python, run inside Ray tasks / actors) -------------------------------
@functools.lru_cache(maxsize=4)
def _preprocessor(model: str):
    """Processor-only encoder (no weights), cached per worker process."""
    from asymvlm.data.encoder import load_encoder

    return load_encoder(model, device="cpu", load_model=False)


def _read_bytes(path: str, offset: Any, length: Any) -> bytes:
    fs, fpath = open_fs(path)
    with fs.open(fpath, "rb") as fh:
        if offset is None:
            return fh.read()
        fh.seek(int(offset))
        return fh.read(int(length))


def load_image(row: dict[str, Any]):
    """The RGB image of a row: its encoded bytes (``data``), or the bytes at ``path`` (any
    filesystem; ``offset``/``length`` for a member of a tar shard). Raises on files that do not
    decode, truncated ones included."""
    from PIL import Image

    data = row.get("data")
    if data is None:
        data = _read_bytes(row["path"], row.get("offset"), row.get("length"))
    image = Image.open(io.BytesIO(data))
    image.load()  # raises on truncated files
    return image.convert("RGB")


def decode_batch(
    batch: pa.Table, model: str, perturbation: str | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Read, decode (perturb) and preprocess a batch of image rows; failures become ``error``
    strings."""
    from asymvlm.data.perturb import item_seed, perturb_image

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
            images.append(None)
            errors.append(f"{type(exc).__name__}: {exc}")
    ok = [im for im in images if im is not None]
    pixels = preprocessor.preprocess_images(ok) if ok else None
    shape = pixels.shape[1:] if pixels is not None else (1,)
    out = np.zeros((len(rows), *shape), dtype=np.float32)
    if pixels is not None:
        out[[i for i, im in enumerate(images) if im is not None]] = pixels
    return {
        "image_id": np.array([r["image_id"] for r in rows], dtype=object),
        "path": np.array([r.get("path") or "" for r in rows], dtype=object),
        "shard": np.array([r["shard"] for r in rows], dtype=np.int64),
        "pixel_values": out,
        "error": np.array(errors, dtype=object),
        "captions": np.array([r.get("captions") or "[]" for r in rows], dtype=object),
    }


def _load_encoder(model: str, device: str, dtype: str, threads: int | None):
    import torch

    from asymvlm.data.encoder import load_encoder

    if threads:  # Ray pins OMP threads to the actor's num_cpus; on CPU-only nodes use the node
        torch.set_num_threads(threads)
    return load_encoder(model, device=device, dtype=dtype)


class _EncoderHolder:
    """The frozen encoder an actor holds (loaded once per actor), its caption chunk size and
    whether it also returns the pre-projection features (``pre_projection``)."""

    def __init__(
        self,
        model: str,
        device: str,
        dtype: str,
        threads: int | None = None,
        text_batch_size: int = 256,
        pre_projection: bool = False,
    ) -> None:
        self.encoder = _load_encoder(model, device, dtype, threads)
        self.text_batch_size = text_batch_size
        self.pre_projection = pre_projection


class EncoderActor(_EncoderHolder):
    """Ray Data actor: embeds decoded images and the captions riding with them (JSON
    ``[[caption_id, text], ...]``) with one model; rows of ``kind`` "image" (failed ones keep
    their ``error``) and "caption" (of images that decoded)."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ok = batch["error"] == ""
        dim = self.encoder.info.dim
        emb = np.zeros((len(ok), dim), dtype=np.float32)
        norm = np.zeros(len(ok), dtype=np.float32)
        pre_dims = self.encoder.pre_dims() if self.pre_projection else None
        image_pre = np.zeros((len(ok), pre_dims["image"]), np.float32) if pre_dims else None
        if ok.any():
            encoded = self.encoder.encode_pixels(batch["pixel_values"][ok], pre=bool(pre_dims))
            emb[ok], norm[ok] = encoded[:2]
            if image_pre is not None:
                image_pre[ok] = encoded[2]
        cap_ids, cap_images, texts = [], [], []
        for image_id, captions, good in zip(
            batch["image_id"], batch.get("captions", [None] * len(ok)), ok, strict=True
        ):
            if good and captions:
                for caption_id, text in json.loads(captions):
                    cap_ids.append(caption_id)
                    cap_images.append(image_id)
                    texts.append(text)
        cap = encode_texts_by_length(self.encoder, texts, self.text_batch_size, bool(pre_dims))
        cap_emb, cap_norm = cap[:2]
        n_cap = len(cap_ids)
        out = {
            "kind": np.array(["image"] * len(ok) + ["caption"] * n_cap, dtype=object),
            "id": np.concatenate([batch["image_id"], np.array(cap_ids, dtype=object)]),
            "image_id": np.concatenate([batch["image_id"], np.array(cap_images, dtype=object)]),
            "path": np.concatenate([batch["path"], np.full(n_cap, "", dtype=object)]),
            "shard": np.concatenate([batch["shard"], np.full(n_cap, -1, dtype=np.int64)]),
            "embedding": np.concatenate([emb, cap_emb.reshape(n_cap, dim)]),
            "norm": np.concatenate([norm, cap_norm]),
            "error": np.concatenate([batch["error"], np.full(n_cap, "", dtype=object)]),
        }
        if pre_dims:
            n = len(ok)
            out["image_pre"] = np.concatenate(
                [image_pre, np.zeros((n_cap, pre_dims["image"]), np.float32)]
            )
            out["text_pre"] = np.concatenate(
                [np.zeros((n, pre_dims["text"]), np.float32), cap[2].reshape(n_cap, -1)]
            )
        return out


class DecodeEncodeActor(EncoderActor):
    """CPU-only clusters: decode inside the encoder actor (no pixel arrays through the object
    store; the encoder is CPU-bound anyway, so separate decode tasks would only add copies)."""

    def __init__(
        self,
        model: str,
        device: str,
        dtype: str,
        image_perturbation: str | None = None,
        perturbation_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, device, dtype, **kwargs)
        self.model = model
        self.perturbation, self.seed = image_perturbation, perturbation_seed

    def __call__(self, batch: pa.Table) -> dict[str, np.ndarray]:  # type: ignore[override]
        return super().__call__(decode_batch(batch, self.model, self.perturbation, self.seed))


class TextEncoderActor(_EncoderHolder):
    """Ray Data actor: embeds text-only batches (class prompts) with the frozen text encoder."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch["text"]]
        emb, norm = encode_texts_by_length(self.encoder, texts, self.text_batch_size)
        return {"caption_id": batch["caption_id"], "embedding": emb, "norm": norm}


def encode_texts_by_length(
    encoder, texts: list[str], batch_size: int, pre: bool = False
) -> tuple[np.ndarray, ...]:
    """``encoder.encode_texts`` over chunks of captions sorted by token count (less padding),
    returned in input order."""
    dim = encoder.info.dim
    out = [np.empty((len(texts), dim), np.float32), np.empty(len(texts), np.float32)]
    if pre:
        out.append(np.empty((len(texts), encoder.pre_dims()["text"]), np.float32))
    if not texts:
        return tuple(out)
    lengths = encoder.token_lengths(texts)
    order = np.argsort(np.asarray(lengths), kind="stable")
    for start in range(0, len(texts), batch_size):
        rows = order[start : start + batch_size]
        for target, value in zip(
            out, encoder.encode_texts([texts[i] for i in rows], pre=pre), strict=True
        ):
            target[rows] = value
    return tuple(out)


def perturb_captions(captions: pa.Table, spec: str, seed: int) -> pa.Table:
    """Replace ``text`` by its perturbed version; the original is kept as ``clean_text``."""
    from asymvlm.data.perturb import item_seed, perturb_caption

    clean = captions.column("text").to_pylist()
    ids = captions.column("caption_id").to_pylist()
    noisy = [
        perturb_caption(text or "", spec, item_seed(seed, cid))
        for text, cid in zip(clean, ids, strict=True)
    ]
    index = captions.column_names.index("text")
    captions = captions.set_column(index, "text", pa.array(noisy, pa.string()))
    return captions.append_column("clean_text", pa.array(clean, pa.string()))
