"""Row-level work of the embedding stage (Ray Data tasks and actors): decode images, embed
images and captions with the frozen encoder."""

from __future__ import annotations

import functools
import io
import json
from typing import Any

import numpy as np
import pyarrow as pa

from asymvlm.data.sources import open_fs


@functools.lru_cache(maxsize=4)
def _preprocessor(model: str):
    """Processor-only encoder (no weights), cached per worker process."""
    from asymvlm.data.encoder import load_encoder

    return load_encoder(model, device="cpu", load_model=False)


def load_image(row: dict[str, Any]):
    """The RGB image of a row: its encoded bytes (``data``), or the bytes at ``path`` (any
    filesystem; ``offset``/``length`` for a member of a tar shard). Raises on files that do not
    decode, truncated ones included."""
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
    ok = [i for i, image in enumerate(images) if image is not None]
    size = preprocessor.image_size
    out = np.zeros((len(rows), 3, size, size), dtype=np.float32)
    if ok:
        out[ok] = preprocessor.preprocess_images([images[i] for i in ok])
    return {
        "image_id": np.array([r["image_id"] for r in rows], dtype=object),
        "path": np.array([r.get("path") or "" for r in rows], dtype=object),
        "shard": np.array([r["shard"] for r in rows], dtype=np.int64),
        "pixel_values": out,
        "error": np.array(errors, dtype=object),
        "captions": np.array([r.get("captions") or "[]" for r in rows], dtype=object),
    }


class EncoderActor:
    """Ray Data actor holding the frozen encoder (loaded once): a batch of decoded images and
    the captions riding with them (JSON ``[[caption_id, text], ...]``) -> rows of ``kind``
    "image" (failed ones keep their ``error``) and "caption"; a text-only batch (``caption_id``,
    ``text``: class prompts) -> its embeddings."""

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

        from asymvlm.data.encoder import load_encoder

        if threads:  # Ray pins OMP threads to the actor's num_cpus; on CPU-only nodes use the node
            torch.set_num_threads(threads)
        self.encoder = load_encoder(model, device=device, dtype=dtype)
        self.text_batch_size = text_batch_size
        self.pre_dims = self.encoder.pre_dims() if pre_projection else None

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "pixel_values" not in batch:
            texts = [str(t) for t in batch["text"]]
            emb, norm = encode_texts_by_length(self.encoder, texts, self.text_batch_size)
            return {"caption_id": batch["caption_id"], "embedding": emb, "norm": norm}
        ok = batch["error"] == ""
        n, dim, pre = len(ok), self.encoder.dim, self.pre_dims
        emb, norm = np.zeros((n, dim), np.float32), np.zeros(n, np.float32)
        image_pre = np.zeros((n, pre["image"]), np.float32) if pre else None
        if ok.any():
            encoded = self.encoder.encode_pixels(batch["pixel_values"][ok], pre=bool(pre))
            emb[ok], norm[ok] = encoded[:2]
            if pre:
                image_pre[ok] = encoded[2]
        riding = [
            (caption_id, image_id, text)
            for image_id, captions, good in zip(
                batch["image_id"], batch["captions"], ok, strict=True
            )
            if good
            for caption_id, text in json.loads(captions)
        ]
        cap_ids, cap_images, texts = (
            (list(c) for c in zip(*riding, strict=True)) if riding else ([], [], [])
        )
        cap = encode_texts_by_length(self.encoder, texts, self.text_batch_size, bool(pre))
        m = len(cap_ids)
        out = {
            "kind": np.array(["image"] * n + ["caption"] * m, dtype=object),
            "id": np.concatenate([batch["image_id"], np.array(cap_ids, dtype=object)]),
            "image_id": np.concatenate([batch["image_id"], np.array(cap_images, dtype=object)]),
            "path": np.concatenate([batch["path"], np.full(m, "", dtype=object)]),
            "shard": np.concatenate([batch["shard"], np.full(m, -1, dtype=np.int64)]),
            "embedding": np.concatenate([emb, cap[0].reshape(m, dim)]),
            "norm": np.concatenate([norm, cap[1]]),
            "error": np.concatenate([batch["error"], np.full(m, "", dtype=object)]),
        }
        if pre:
            out["image_pre"] = np.concatenate([image_pre, np.zeros((m, pre["image"]), np.float32)])
            text_pre = cap[2].reshape(m, -1)
            out["text_pre"] = np.concatenate([np.zeros((n, pre["text"]), np.float32), text_pre])
        return out


def encode_texts_by_length(
    encoder, texts: list[str], batch_size: int, pre: bool = False
) -> tuple[np.ndarray, ...]:
    """``encoder.encode_texts`` over chunks of captions sorted by token count (less padding),
    returned in input order."""
    if not texts:
        return encoder.empty("text" if pre else None)
    out = [np.empty((len(texts), encoder.dim), np.float32), np.empty(len(texts), np.float32)]
    if pre:
        out.append(np.empty((len(texts), encoder.pre_dims()["text"]), np.float32))
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
