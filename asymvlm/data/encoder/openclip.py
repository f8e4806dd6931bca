"""Frozen open_clip encoders (``open_clip:ARCH/TAG``, ``open_clip:ARCH/WEIGHTS``,
``open_clip:hf-hub:ORG/REPO``, ``open_clip:local-dir:FOLDER``; docs/data.md).
"""

from __future__ import annotations

import os
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
from asymvlm.data.encoder.names import OpenClipName, parse_name

__all__ = ["OpenClipEncoder", "import_open_clip"]

# open_clip's precision names for the dtypes: "fp16"/"bf16" cast the weights but keep its
# LayerNormFp32 layers in float32, as open_clip runs low-precision inference itself.
_PRECISION = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def import_open_clip():
    """The ``open_clip`` module (ImportError saying how to install it)."""
    try:
        import open_clip
    except ImportError as err:
        raise ImportError(
            f"open_clip models need the open_clip_torch package (pip install open_clip_torch): "
            f"{err}"
        ) from err
    return open_clip


class OpenClipEncoder(Encoder):
    """A frozen open_clip model; ``max_text_length`` can only be its context length and
    ``revision`` is unused (a pretrained tag names one set of weights)."""

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        max_text_length: int | None = None,
        *,
        revision: str | None = None,
        load_model: bool = True,
    ) -> None:
        import logging

        open_clip = import_open_clip()
        from open_clip.transform import PreprocessCfg, image_transform_v2

        parsed = parse_name(model)
        if parsed.local is not None and not os.path.exists(parsed.local):
            raise FileNotFoundError(f"Encoder model {model!r}: {parsed.local} does not exist")
        self.model_name = parsed.name
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        # open_clip reports through the root logger (INFO while loading, a WARNING for a model
        # without weights and an ERROR listing the tags of an unknown one: both become the
        # error raised here).
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.CRITICAL)
        try:
            if load_model:
                net = open_clip.create_model(
                    parsed.model_name,
                    parsed.pretrained,
                    precision=_PRECISION[self.dtype],
                    device=self.device,
                    require_pretrained=True,
                )
                net.eval().requires_grad_(False)
            else:
                with torch.device("meta"):
                    net = open_clip.create_model(
                        parsed.model_name, parsed.pretrained, device="meta", load_weights=False
                    )
            tokenizer = open_clip.get_tokenizer(parsed.model_name)
        except (OSError, RuntimeError, ValueError, KeyError) as err:
            hint = ""
            if parsed.pretrained and not parsed.local and "tag" in str(err):
                tags = open_clip.list_pretrained_tags_by_model(parsed.model_name)
                hint = f" (tags of {parsed.model_name}: {', '.join(tags) or 'none'})"
            raise OSError(f"Could not load encoder model {model!r}: {err}{hint}") from err
        finally:
            root.setLevel(level)
        self.model = net if load_model else None
        self.preprocess_cfg = dict(net.visual.preprocess_cfg)
        self.transform = image_transform_v2(PreprocessCfg(**self.preprocess_cfg), is_train=False)
        self.tokenizer = tokenizer
        context = int(getattr(tokenizer, "context_length", 0) or net.context_length)
        if max_text_length not in (None, context):
            raise ValueError(
                f"open_clip models encode captions of their context length ({context} tokens "
                f"for {model!r}), not {max_text_length}: their positional embedding has that size"
            )
        self.max_text_length = context
        size = self.preprocess_cfg["size"]
        self.image_size = int(size if isinstance(size, int) else size[0])
        dim = getattr(net.visual, "output_dim", None)
        if dim is None:  # towers that do not say (timm): the shape of one caption's embedding
            with torch.inference_mode():
                dim = net.encode_text(tokenizer(["a"]).to(next(net.parameters()).device)).shape[-1]
        self.info = EncoderInfo(
            model=parsed.name,
            revision=None,
            files_sha256=files_sha256(parsed.local) if parsed.local else None,
            family="open_clip",
            dim=int(dim),
            dtype=str(self.dtype).removeprefix("torch."),
            device=str(self.device),
            preprocessing=self._preprocessing(parsed),
        )

    def _preprocessing(self, parsed: OpenClipName) -> dict[str, Any]:
        cfg = {k: list(v) if isinstance(v, tuple) else v for k, v in self.preprocess_cfg.items()}
        return {
            "library": "open_clip",
            "open_clip_version": _version(),
            "architecture": parsed.model_name,
            "pretrained": None if parsed.local else parsed.pretrained,
            "image_size": self.image_size,
            **cfg,
            "tokenizer": type(self.tokenizer).__name__,
            "max_text_length": self.max_text_length,
            "text_padding": "max_length",
        }

    # ------------------------------------------------------------------ images
    def preprocess_images(self, images: list) -> np.ndarray:
        """PIL images to float32 pixels [n, 3, H, W] with open_clip's inference transform."""
        images = list(images)
        if not images:
            return np.zeros((0, 3, self.image_size, self.image_size), dtype=np.float32)
        pixels = torch.stack([self.transform(image) for image in images])
        return np.ascontiguousarray(pixels.numpy(), dtype=np.float32)

    def encode_pixels(self, pixel_values: np.ndarray, pre: bool = False) -> tuple[np.ndarray, ...]:
        """Pixels [n, 3, H, W] to (unit embeddings float32 [n, d], raw norms [n])."""
        if pre:
            self.pre_dims()
        model = self._require_model()
        if len(pixel_values) == 0:
            return self._empty()
        pixels = torch.as_tensor(np.asarray(pixel_values), dtype=self.dtype, device=self.device)
        if pixels.ndim != 4:
            raise ValueError(f"pixel_values must be [n, 3, H, W], got shape {tuple(pixels.shape)}")
        with torch.inference_mode():
            return unit_and_norm(model.encode_image(pixels, normalize=False))

    # ------------------------------------------------------------------- texts
    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Token ids [n, context length] exactly as :meth:`encode_texts` feeds them."""
        return {"text": self.tokenizer([str(t) for t in texts])}

    def token_lengths(self, texts: list[str]) -> list[int]:
        """One length for every caption: open_clip pads each to the context length, so there is
        no padding to save by grouping captions of similar length."""
        return [self.max_text_length] * len(texts)

    def encode_texts(self, texts: list[str], pre: bool = False) -> tuple[np.ndarray, ...]:
        """Captions to (unit embeddings float32 [n, d], raw projection norms float32 [n])."""
        if pre:
            self.pre_dims()
        model = self._require_model()
        texts = list(texts)
        if not texts:
            return self._empty()
        tokens = self.tokenize(texts)["text"].to(self.device)
        with torch.inference_mode():
            return unit_and_norm(model.encode_text(tokens, normalize=False))


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("open_clip_torch")
    except Exception:
        return None
