"""Frozen transformers CLIP / SigLIP encoders: unit embeddings plus raw norms (docs/data.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch
from huggingface_hub import try_to_load_from_cache

from asymvlm.embedding.encoders.encoder import Encoder, files_sha256, unit_and_norm
from asymvlm.embedding.encoders.names import looks_like_path


def _hub_commit(model: str, revision: str | None) -> str | None:
    """The commit of the cached hub snapshot the files were loaded from, if any."""
    if re.fullmatch(r"[0-9a-fA-F]{40}", revision or ""):
        return revision
    found = try_to_load_from_cache(model, "config.json", revision=revision)
    return Path(found).parent.name if isinstance(found, str) else None


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
        self.family = family = config.model_type
        if family not in ("clip", "siglip"):
            raise ValueError(f"encoder model {model!r} is a {family!r}, not clip or siglip")
        self.config = config
        processor = transformers.AutoProcessor.from_pretrained(model, revision=revision)
        self.tokenizer = processor.tokenizer
        self.image_processor = processor.image_processor
        self.model = None
        if load_model:
            cls = transformers.CLIPModel if family == "clip" else transformers.SiglipModel
            self.model = cls.from_pretrained(model, revision=revision, dtype=self.dtype)
            self.model.to(self.device).eval().requires_grad_(False)
        self.image_size = int(config.vision_config.image_size)
        self.max_text_length = int(config.text_config.max_position_embeddings)
        # SigLIP was trained on captions padded to max_length without an attention mask
        self._padding = True if family == "clip" else "max_length"
        text = config.text_config
        dim = config.projection_dim if family == "clip" else text.projection_size
        backend = [c.__name__ for c in type(self.image_processor).mro() if "Backend" in c.__name__]
        self.info = self._info(
            model=model,
            family=family,
            dim=int(dim or text.hidden_size),
            revision=None if local else _hub_commit(model, revision),
            files_sha256=files_sha256(model) if local else None,
            preprocessing={
                **self.image_processor.to_dict(),
                "image_size": self.image_size,
                "image_backend": backend[0] if backend else None,  # torchvision / PIL resize
                "tokenizer": type(self.tokenizer).__name__,
                "max_text_length": self.max_text_length,
                "text_padding": "longest" if family == "clip" else "max_length",
            },
        )

    def _preprocess(self, images: list) -> np.ndarray:
        return self.image_processor(images=images, return_tensors="np")["pixel_values"]

    def _image(self, pixels: torch.Tensor, pre: bool) -> tuple[np.ndarray, ...]:
        if self.family != "clip":
            out = self.model.get_image_features(pixel_values=pixels)
            return unit_and_norm(getattr(out, "pooler_output", out))
        pooled = self.model.vision_model(pixel_values=pixels).pooler_output
        out = unit_and_norm(self.model.visual_projection(pooled))
        return (*out, pooled.float().cpu().numpy()) if pre else out

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
        return {k: batch[k].to(self.device) for k in keys}

    def _text(self, texts: list[str], pre: bool) -> tuple[np.ndarray, ...]:
        inputs = self.tokenize(texts)
        if self.family != "clip":
            out = self.model.get_text_features(**inputs)
            return unit_and_norm(getattr(out, "pooler_output", out))
        pooled = self.model.text_model(**inputs).pooler_output
        out = unit_and_norm(self.model.text_projection(pooled))
        return (*out, pooled.float().cpu().numpy()) if pre else out

    def token_lengths(self, texts: list[str]) -> list[int]:
        kw = {"truncation": True, "max_length": self.max_text_length}
        return [len(row) for row in self.tokenizer([str(t) for t in texts], **kw)["input_ids"]]

    def pre_dims(self) -> dict[str, int]:
        """``{"image": vision hidden size, "text": text hidden size}`` (CLIP only)."""
        if self.family != "clip":
            raise ValueError(
                f"pre-projection features are written for CLIP models only, not {self.family!r} "
                "(BayesVLM needs the embedding as a linear projection of a pooled feature)"
            )
        vision, text = self.config.vision_config, self.config.text_config
        return {"image": vision.hidden_size, "text": text.hidden_size}

    def projections(self) -> dict[str, np.ndarray]:
        """The final projections as float32 ``{"image": [d, pre_dims.image], "text": [d,
        pre_dims.text]}`` (bias-free ``nn.Linear`` weights: raw projection = matrix @ x)."""
        self.pre_dims()
        layers = {"image": self.model.visual_projection, "text": self.model.text_projection}
        return {kind: layer.weight.detach().float().cpu().numpy() for kind, layer in layers.items()}
