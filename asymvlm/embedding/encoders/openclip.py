"""Frozen open_clip encoders (``open_clip:...`` names: docs/data.md)."""

from __future__ import annotations

import logging
import os
from importlib.metadata import version

import numpy as np
import open_clip
import torch
from open_clip.transform import PreprocessCfg, image_transform_v2

from asymvlm.embedding.encoders.encoder import Encoder, files_sha256, unit_and_norm
from asymvlm.embedding.encoders.names import parse_name


class OpenClipEncoder(Encoder):
    """A frozen open_clip model; ``revision`` is unused (a pretrained tag names its weights)."""

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        *,
        revision: str | None = None,
        load_model: bool = True,
    ) -> None:
        super().__init__(device, dtype)
        name = parse_name(model)
        if name.local is not None and not os.path.exists(name.local):
            raise FileNotFoundError(f"encoder model {model!r}: {name.local} does not exist")
        # open_clip logs through the root logger (an ERROR listing the tags of an unknown one)
        root, level = logging.getLogger(), logging.getLogger().level
        root.setLevel(logging.CRITICAL)
        try:
            if load_model:  # open_clip's "fp16"/"bf16" keep its LayerNormFp32 layers in float32
                precision = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(self.dtype, "fp32")
                net = open_clip.create_model(
                    name.model_name,
                    name.pretrained,
                    precision=precision,
                    device=self.device,
                    require_pretrained=True,
                )
            else:
                with torch.device("meta"):
                    net = open_clip.create_model(
                        name.model_name, name.pretrained, device="meta", load_weights=False
                    )
            self.tokenizer = open_clip.get_tokenizer(name.model_name)
        except (OSError, RuntimeError, ValueError, KeyError) as err:
            hint = ""
            if name.pretrained and not name.local and "tag" in str(err):
                tags = open_clip.list_pretrained_tags_by_model(name.model_name)
                hint = f" (tags of {name.model_name}: {', '.join(tags) or 'none'})"
            raise OSError(f"could not load encoder model {model!r}: {err}{hint}") from err
        finally:
            root.setLevel(level)
        self.model = net.eval().requires_grad_(False) if load_model else None
        cfg = dict(net.visual.preprocess_cfg)
        self.transform = image_transform_v2(PreprocessCfg(**cfg), is_train=False)
        self.max_text_length = int(self.tokenizer.context_length)
        self.image_size = int(np.atleast_1d(cfg["size"])[0])
        dim = getattr(net.visual, "output_dim", None)
        if dim is None:  # towers that do not say (timm): the width of one caption's embedding
            with torch.inference_mode():
                dim = net.encode_text(self.tokenizer(["a"]).to(self.device)).shape[-1]
        self.info = self._info(
            model=name.name,
            family="open_clip",
            dim=int(dim),
            revision=None,
            files_sha256=files_sha256(name.local) if name.local else None,
            preprocessing={
                "library": "open_clip",
                "open_clip_version": version("open_clip_torch"),
                "architecture": name.model_name,
                "pretrained": None if name.local else name.pretrained,
                "image_size": self.image_size,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
                "tokenizer": type(self.tokenizer).__name__,
                "max_text_length": self.max_text_length,
                "text_padding": "max_length",
            },
        )

    def _preprocess(self, images: list) -> np.ndarray:
        return torch.stack([self.transform(image) for image in images]).numpy()

    def _image(self, pixels: torch.Tensor, pre: bool) -> tuple[np.ndarray, ...]:
        return unit_and_norm(self.model.encode_image(pixels, normalize=False))

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Token ids [n, context length] exactly as :meth:`encode_texts` feeds them."""
        return {"text": self.tokenizer([str(t) for t in texts]).to(self.device)}

    def _text(self, texts: list[str], pre: bool) -> tuple[np.ndarray, ...]:
        return unit_and_norm(self.model.encode_text(self.tokenize(texts)["text"], normalize=False))
