"""Frozen transformers CLIP / SigLIP encoders: unit embeddings plus raw norms (docs/data.md)."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import torch

from asymvlm.data.encoder.base import (
    Encoder,
    EncoderInfo,
    files_sha256,
    resolve_device,
    resolve_dtype,
    unit_and_norm,
)
from asymvlm.data.encoder.names import looks_like_path

__all__ = ["FAMILIES", "TransformersEncoder", "pre_projection_dims"]

FAMILIES = ("clip", "siglip")


def _hub_commit(model: str, revision: str | None) -> str | None:
    """The commit hash of the cached hub snapshot the files were loaded from, if any."""
    try:
        from transformers.utils.hub import cached_file, extract_commit_hash

        resolved = cached_file(model, "config.json", revision=revision)
        return extract_commit_hash(resolved, None)
    except Exception:  # provenance only: never fail a load because of it
        return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)


def _projection(output: Any) -> torch.Tensor:
    """The projected embedding from ``get_*_features`` (a tensor in transformers 4, a ModelOutput
    whose ``pooler_output`` is the projection in transformers 5)."""
    if isinstance(output, torch.Tensor):
        return output
    pooled = getattr(output, "pooler_output", None)
    if isinstance(pooled, torch.Tensor):
        return pooled
    raise TypeError(f"Cannot find the projected embedding in {type(output).__name__}")


def pre_projection_dims(config: Any) -> dict[str, int]:
    """``{"image": vision hidden size, "text": text hidden size}`` of a CLIP config; ValueError
    for models without bias-free final projections (SigLIP)."""
    family = getattr(config, "model_type", None)
    if family != "clip":
        raise ValueError(
            f"pre-projection features are written for CLIP models only, not {family!r}: SigLIP's "
            "image embedding is its attention-pooling head's MLP output plus a residual, not a "
            "linear projection of a pooled feature (and its text head has a bias), so there is "
            "no projection layer for BayesVLM's posterior in this form"
        )
    return {
        "image": int(config.vision_config.hidden_size),
        "text": int(config.text_config.hidden_size),
    }


class TransformersEncoder(Encoder):
    """A frozen transformers CLIP or SigLIP model (hub id or folder); ``load_model=False``
    loads only the processor, for preprocessing in CPU workers."""

    def __init__(
        self,
        model: str = "openai/clip-vit-base-patch32",
        device: str = "auto",
        dtype: str = "auto",
        max_text_length: int | None = None,
        *,
        revision: str | None = None,
        load_model: bool = True,
    ) -> None:
        import transformers
        from transformers import AutoConfig, AutoProcessor

        model = os.path.expanduser(os.fspath(model))
        local = os.path.isdir(model)
        if not local and (looks_like_path(model) or os.path.exists(model)):
            raise FileNotFoundError(f"Encoder model directory {model!r} does not exist")
        self.model_name = model
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)

        try:
            config = AutoConfig.from_pretrained(model, revision=revision)
            family = config.model_type
            if family not in FAMILIES:
                raise ValueError(
                    f"Encoder model {model!r} has model_type {family!r}; "
                    f"supported families: {', '.join(FAMILIES)}"
                )
            self.processor = AutoProcessor.from_pretrained(model, revision=revision)
            self.model = None
            if load_model:
                cls = transformers.CLIPModel if family == "clip" else transformers.SiglipModel
                major = int(transformers.__version__.split(".")[0])
                dtype_kw = {"dtype" if major >= 5 else "torch_dtype": self.dtype}
                self.model = cls.from_pretrained(model, revision=revision, **dtype_kw)
                self.model.to(self.device).eval().requires_grad_(False)
        except (OSError, ImportError) as err:
            from huggingface_hub import constants

            offline = " (offline mode: a hub id must already be in the Hugging Face cache)"
            hint = offline if constants.HF_HUB_OFFLINE else ""
            raise OSError(f"Could not load encoder model {model!r}{hint}: {err}") from err
        except ValueError as err:
            if model in str(err):
                raise
            raise ValueError(f"Could not load encoder model {model!r}: {err}") from err

        self.family = family
        self.config = config
        self.tokenizer = self.processor.tokenizer
        self.image_processor = self.processor.image_processor
        text_limit = int(config.text_config.max_position_embeddings)
        if max_text_length is None:
            max_text_length = text_limit
        if not 0 < max_text_length <= text_limit:
            raise ValueError(
                f"max_text_length must be in [1, {text_limit}] for {model!r}, got {max_text_length}"
            )
        self.max_text_length = int(max_text_length)
        if family == "clip":
            dim = int(config.projection_dim)
            self._padding: str | bool = True
            self._use_attention_mask = True
        else:
            text = config.text_config
            dim = int(getattr(text, "projection_size", None) or text.hidden_size)
            self._padding = "max_length"
            self._use_attention_mask = False
        self.image_size = int(config.vision_config.image_size)

        self.info = EncoderInfo(
            model=model,
            revision=None
            if local
            else (revision if _is_sha(revision) else _hub_commit(model, revision)),
            files_sha256=files_sha256(model) if local else None,
            family=family,
            dim=dim,
            dtype=str(self.dtype).removeprefix("torch."),
            device=str(self.device),
            preprocessing=self._preprocessing(),
        )

    def _preprocessing(self) -> dict[str, Any]:
        ip = self.image_processor
        keys = (
            "do_convert_rgb",
            "do_resize",
            "size",
            "resample",
            "do_center_crop",
            "crop_size",
            "do_rescale",
            "rescale_factor",
            "do_normalize",
            "image_mean",
            "image_std",
        )
        settings = ip.to_dict()  # plain JSON types, unlike the live attributes (SizeDict)
        out: dict[str, Any] = {
            "image_size": self.image_size,
            "image_processor": type(ip).__name__,
        }
        # transformers 5 picks a torchvision or a PIL backend (by what is installed): the two
        # resize slightly differently, so which one ran belongs to the provenance
        backend = [c.__name__ for c in type(ip).__mro__ if c.__name__.endswith("Backend")]
        if backend:
            out["image_backend"] = backend[0]
        for key in keys:
            if settings.get(key) is not None:
                out[key] = _jsonable(settings[key])
        if isinstance(out.get("resample"), int):
            try:
                from PIL import Image

                out["resample"] = Image.Resampling(out["resample"]).name.lower()
            except ValueError:
                pass
        out.update(
            tokenizer=type(self.tokenizer).__name__,
            max_text_length=self.max_text_length,
            text_padding="max_length" if self._padding == "max_length" else "longest",
            text_truncation=True,
            text_attention_mask=self._use_attention_mask,
        )
        return out

    # ------------------------------------------------------------------ images
    def preprocess_images(self, images: list) -> np.ndarray:
        """PIL images to float32 ``pixel_values`` [n, 3, H, W] with the model's processor (CPU)."""
        images = list(images)
        if not images:
            return np.zeros((0, 3, self.image_size, self.image_size), dtype=np.float32)
        pixels = self.image_processor(images=images, return_tensors="np")["pixel_values"]
        return np.ascontiguousarray(pixels, dtype=np.float32)

    def encode_pixels(self, pixel_values: np.ndarray, pre: bool = False) -> tuple[np.ndarray, ...]:
        """``pixel_values`` [n, 3, H, W] to (unit embeddings float32 [n, d], raw norms [n]);
        with ``pre`` also the pre-projection features float32 [n, pre_dim.image]."""
        model = self._require_model()
        if len(pixel_values) == 0:
            return self._empty("image" if pre else None)
        pixels = torch.as_tensor(np.asarray(pixel_values), dtype=self.dtype, device=self.device)
        if pixels.ndim != 4:
            raise ValueError(f"pixel_values must be [n, 3, H, W], got shape {tuple(pixels.shape)}")
        with torch.inference_mode():
            if not pre:
                return unit_and_norm(_projection(model.get_image_features(pixel_values=pixels)))
            self.pre_dims()  # CLIP only
            pooled = model.vision_model(pixel_values=pixels).pooler_output
            projected = model.visual_projection(pooled)
        return (*unit_and_norm(projected), pooled.float().cpu().numpy())

    # ------------------------------------------------------------------- texts
    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Token tensors exactly as :meth:`encode_texts` feeds them to the model."""
        batch = self.tokenizer(
            [str(t) for t in texts],
            padding=self._padding,
            truncation=True,
            max_length=self.max_text_length,
            return_tensors="pt",
        )
        inputs = {"input_ids": batch["input_ids"]}
        if self._use_attention_mask and "attention_mask" in batch:
            inputs["attention_mask"] = batch["attention_mask"]
        return inputs

    def token_lengths(self, texts: list[str]) -> list[int]:
        """Token count of each caption, truncated as :meth:`tokenize` truncates."""
        ids = self.tokenizer(
            [str(t) for t in texts], truncation=True, max_length=self.max_text_length
        )["input_ids"]
        return [len(row) for row in ids]

    def encode_texts(self, texts: list[str], pre: bool = False) -> tuple[np.ndarray, ...]:
        """Captions to (unit embeddings float32 [n, d], raw projection norms float32 [n]); with
        ``pre`` also the pre-projection features float32 [n, pre_dim.text]."""
        model = self._require_model()
        texts = list(texts)
        if not texts:
            return self._empty("text" if pre else None)
        inputs = {k: v.to(self.device) for k, v in self.tokenize(texts).items()}
        with torch.inference_mode():
            if not pre:
                return unit_and_norm(_projection(model.get_text_features(**inputs)))
            self.pre_dims()  # CLIP only
            pooled = model.text_model(**inputs).pooler_output
            projected = model.text_projection(pooled)
        return (*unit_and_norm(projected), pooled.float().cpu().numpy())

    # ------------------------------------------------------- pre-projection
    def pre_dims(self) -> dict[str, int]:
        """Widths of the pre-projection features (:func:`pre_projection_dims`)."""
        return pre_projection_dims(self.config)

    def projections(self) -> dict[str, np.ndarray]:
        """The frozen model's final projections as float32 ``{"image": [d, pre_dim.image],
        "text": [d, pre_dim.text]}`` (``nn.Linear`` weights, no bias), so that the raw
        projection of a pre-projection feature ``x`` is ``matrix @ x``."""
        self.pre_dims()
        model = self._require_model()
        return {
            "image": model.visual_projection.weight.detach().float().cpu().numpy(),
            "text": model.text_projection.weight.detach().float().cpu().numpy(),
        }


def _is_sha(revision: str | None) -> bool:
    return re.fullmatch(r"[0-9a-fA-F]{40}", revision or "") is not None
