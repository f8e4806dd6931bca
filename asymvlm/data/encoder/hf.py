"""Frozen transformers CLIP / SigLIP encoders: unit embeddings plus raw norms (docs/data.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asymvlm.data.encoder.base import Encoder, files_sha256, unit_and_norm
from asymvlm.data.encoder.names import looks_like_path

__all__ = ["TransformersEncoder", "pre_projection_dims"]


def _hub_commit(model: str, revision: str | None) -> str | None:
    """The commit of the cached hub snapshot the files were loaded from, if any."""
    if re.fullmatch(r"[0-9a-fA-F]{40}", revision or ""):
        return revision
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model, "config.json", revision=revision)
    return Path(found).parent.name if isinstance(found, str) else None


def pre_projection_dims(config: Any) -> dict[str, int]:
    """``{"image": vision hidden size, "text": text hidden size}`` of a CLIP config; ValueError
    for SigLIP, whose heads are not bias-free linear projections of a pooled feature."""
    if config.model_type != "clip":
        raise ValueError(
            "pre-projection features are written for CLIP models only, not "
            f"{config.model_type!r}: SigLIP's embeddings are no linear projection of a pooled "
            "feature, so BayesVLM's posterior has no projection layer to act on"
        )
    return {"image": config.vision_config.hidden_size, "text": config.text_config.hidden_size}


class TransformersEncoder(Encoder):
    """A frozen transformers CLIP or SigLIP model (hub id or folder, at ``revision``)."""

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        *,
        revision: str | None = None,
        load_model: bool = True,
    ) -> None:
        import transformers

        super().__init__(device, dtype)
        model = os.path.expanduser(os.fspath(model))
        local = os.path.isdir(model)
        if not local and (looks_like_path(model) or os.path.exists(model)):
            raise FileNotFoundError(f"encoder model directory {model!r} does not exist")
        try:
            config = transformers.AutoConfig.from_pretrained(model, revision=revision)
        except OSError as err:
            raise OSError(f"could not load encoder model {model!r}: {err}") from err
        self.family = config.model_type
        if self.family not in ("clip", "siglip"):
            raise ValueError(f"encoder model {model!r} is a {self.family!r}, not clip or siglip")
        self.config = config
        self.processor = transformers.AutoProcessor.from_pretrained(model, revision=revision)
        self.tokenizer = self.processor.tokenizer
        self.image_processor = self.processor.image_processor
        self.model = None
        if load_model:
            cls = transformers.CLIPModel if self.family == "clip" else transformers.SiglipModel
            self.model = cls.from_pretrained(model, revision=revision, dtype=self.dtype)
            self.model.to(self.device).eval().requires_grad_(False)
        self.image_size = int(config.vision_config.image_size)
        self.max_text_length = int(config.text_config.max_position_embeddings)
        # SigLIP was trained on captions padded to max_length without an attention mask
        self._padding = True if self.family == "clip" else "max_length"
        text = config.text_config
        dim = config.projection_dim if self.family == "clip" else text.projection_size
        backend = [
            c.__name__ for c in type(self.image_processor).__mro__ if "Backend" in c.__name__
        ]
        self.info = self._info(
            model,
            self.family,
            int(dim or text.hidden_size),
            revision=None if local else _hub_commit(model, revision),
            files_sha256=files_sha256(model) if local else None,
            preprocessing={
                **self.image_processor.to_dict(),
                "image_size": self.image_size,
                "image_backend": backend[0] if backend else None,  # torchvision / PIL resize
                "tokenizer": type(self.tokenizer).__name__,
                "max_text_length": self.max_text_length,
                "text_padding": "longest" if self._padding is True else "max_length",
            },
        )

    def _preprocess(self, images: list) -> np.ndarray:
        return self.image_processor(images=images, return_tensors="np")["pixel_values"]

    def encode_pixels(self, pixel_values: np.ndarray, pre: bool = False) -> tuple[np.ndarray, ...]:
        """``pixel_values`` [n, 3, H, W] to (unit embeddings float32 [n, d], raw norms [n]);
        with ``pre`` also the pre-projection features float32 [n, pre_dims.image]."""
        model, pixels = self._net(pixel_values)
        if not len(pixels):
            return self.empty("image" if pre else None)
        with torch.inference_mode():
            if not pre:
                out = model.get_image_features(pixel_values=pixels)
                return unit_and_norm(getattr(out, "pooler_output", out))
            self.pre_dims()
            pooled = model.vision_model(pixel_values=pixels).pooler_output
            return (*unit_and_norm(model.visual_projection(pooled)), pooled.float().cpu().numpy())

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Token tensors exactly as :meth:`encode_texts` feeds them to the model."""
        batch = self.tokenizer(
            [str(t) for t in texts],
            padding=self._padding,
            truncation=True,
            max_length=self.max_text_length,
            return_tensors="pt",
        )
        keys = ("input_ids", "attention_mask") if self.family == "clip" else ("input_ids",)
        return {k: batch[k] for k in keys}

    def token_lengths(self, texts: list[str]) -> list[int]:
        ids = self.tokenizer(
            [str(t) for t in texts], truncation=True, max_length=self.max_text_length
        )["input_ids"]
        return [len(row) for row in ids]

    def encode_texts(self, texts: list[str], pre: bool = False) -> tuple[np.ndarray, ...]:
        """Captions to (unit embeddings float32 [n, d], raw projection norms float32 [n]); with
        ``pre`` also the pre-projection features float32 [n, pre_dims.text]."""
        model = self._net()
        if not texts:
            return self.empty("text" if pre else None)
        inputs = {k: v.to(self.device) for k, v in self.tokenize(list(texts)).items()}
        with torch.inference_mode():
            if not pre:
                out = model.get_text_features(**inputs)
                return unit_and_norm(getattr(out, "pooler_output", out))
            self.pre_dims()
            pooled = model.text_model(**inputs).pooler_output
            return (*unit_and_norm(model.text_projection(pooled)), pooled.float().cpu().numpy())

    def pre_dims(self) -> dict[str, int]:
        return pre_projection_dims(self.config)

    def projections(self) -> dict[str, np.ndarray]:
        """The final projections as float32 ``{"image": [d, pre_dims.image], "text": [d,
        pre_dims.text]}`` (bias-free ``nn.Linear`` weights: raw projection = matrix @ x)."""
        self.pre_dims()
        model = self._net()
        return {
            "image": model.visual_projection.weight.detach().float().cpu().numpy(),
            "text": model.text_projection.weight.detach().float().cpu().numpy(),
        }
