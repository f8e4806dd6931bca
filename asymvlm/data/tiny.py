"""Tiny random CLIP / SigLIP / open_clip checkpoints that load like hub models, offline and
deterministic in ``seed`` (for tests and the offline demo: their numbers mean nothing)."""

from __future__ import annotations

import contextlib
import json
import os
import string
from collections import Counter
from pathlib import Path

import torch

from asymvlm import logs, storage

TINY_IMAGE_SIZE = 64
#: The key a tiny model's config file holds (true), by which it is recognised.
RANDOM_MARK = "random_test_model"
_LAYERS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
_VISION = dict(**_LAYERS, image_size=TINY_IMAGE_SIZE, patch_size=16)
# A small caption-like corpus (the tokenizer's vocabulary) and every printable character.
_CORPUS = [
    "a an the of on in at with and to near by from under over next its their his her two three "
    "four several some many one man woman person people boy girl child children player group "
    "dog cat horse bird cow sheep elephant giraffe zebra bear animal animals "
    "table plate plates food pizza sandwich cake bowl cup glass bottle knife fork spoon utensil "
    "street road car bus truck train bike bicycle motorcycle airplane boat sign light traffic "
    "kitchen bathroom room bed couch chair desk sink toilet window door oven refrigerator "
    "field grass tree trees branch water beach ocean snow sky mountain park building city "
    "red blue green yellow white black brown orange small large big old young tall "
    "sitting standing walking riding holding eating playing looking lying flying parked "
    "is are was being has have there this that it top front side back down up "
    "photo picture image view close",
    " ".join(string.printable.strip()),
]


def _train_bpe(words: Counter, num_merges: int) -> list[tuple[str, str]]:
    """BPE merges, most frequent pair first, ties broken lexicographically (the ``tokenizers``
    trainer breaks ties in hash order, so its checkpoints differ from run to run)."""
    entries = [(list(w[:-1]) + [w[-1] + "</w>"], c) for w, c in sorted(words.items()) if w]
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pairs: Counter = Counter()
        for symbols, count in entries:
            for pair in zip(symbols, symbols[1:], strict=False):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for symbols, _ in entries:
            j = 0
            while j < len(symbols) - 1:
                if (symbols[j], symbols[j + 1]) == best:
                    symbols[j : j + 2] = [symbols[j] + symbols[j + 1]]
                j += 1
    return merges


def _clip_tokenizer(max_length: int):
    """A byte-level BPE with CLIP's exact pipeline (``</w>`` suffix, specials at the end)."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    backend = CLIPTokenizer().backend_tokenizer  # empty: its normaliser and pre-tokeniser
    words: Counter = Counter()
    for line in _CORPUS:
        text = backend.normalizer.normalize_str(line) if backend.normalizer else line
        words.update(piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text))
    merges = _train_bpe(words, 300)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {}
    for token in [*alphabet, *(c + "</w>" for c in alphabet), *(a + b for a, b in merges)]:
        vocab.setdefault(token, len(vocab))
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab.setdefault(special, len(vocab))
    end = "<|endoftext|>"
    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        bos_token="<|startoftext|>",
        eos_token=end,
        pad_token=end,
        unk_token=end,
        model_max_length=max_length,
    )


def _save(directory, seed: int, family: str, max_length: int, images: dict, **config) -> str:
    """Write a random transformers ``family`` model and its processor (the tiny BPE; a
    PIL-backed image processor when this transformers has one)."""
    import transformers

    prefix = {"clip": "CLIP", "siglip": "Siglip"}[family]
    tok = _clip_tokenizer(max_length)
    ids = {f"{k}_token_id": getattr(tok, f"{k}_token_id") for k in ("pad", "bos", "eos")}
    text = dict(**_LAYERS, max_position_embeddings=max_length, vocab_size=len(tok), **ids)
    text.update(config.pop("text", {}))
    model = getattr(transformers, f"{prefix}Config")(
        text_config=text, vision_config=_VISION, **config, **{RANDOM_MARK: True}
    )
    kind = f"{prefix}ImageProcessor"
    processor = getattr(transformers, f"{prefix}Processor")(
        (getattr(transformers, f"{kind}Pil", None) or getattr(transformers, kind))(**images), tok
    )
    directory = os.fspath(directory)
    torch.manual_seed(seed)
    with logs.quiet_transformers():
        getattr(transformers, f"{prefix}Model")(model).eval().save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


_SIZE = {"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE}


#: The text tower of CLIP ViT-B/32 (its shape; the weights of these models are random).
VIT_B32_TEXT = dict(
    hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8
)


def save_tiny_clip(
    directory: str | os.PathLike,
    seed: int = 0,
    *,
    projection_dim: int = 24,
    text_tower: dict[str, int] | None = None,
) -> str:
    """Write a tiny random CLIP (hidden 32, 2 layers, 64 px, patch 16) and its processor;
    ``text_tower``: another text tower's shape (:data:`VIT_B32_TEXT`)."""
    images = {"size": {"shortest_edge": TINY_IMAGE_SIZE}, "crop_size": _SIZE}
    text = {"text": text_tower} if text_tower else {}
    return _save(directory, seed, "clip", 77, images, projection_dim=projection_dim, **text)


def save_tiny_siglip(directory: str | os.PathLike, seed: int = 0) -> str:
    """Write a tiny random SigLIP (embedding dim 32, 64 px, patch 16) and its processor."""
    return _save(directory, seed, "siglip", 64, {"size": _SIZE}, text={"projection_size": 32})


def save_tiny_open_clip(directory: str | os.PathLike, seed: int = 0) -> str:
    """Write a tiny random open_clip CLIP (width 32, 2 layers, 64 px, patch 16; open_clip's
    BPE) as a folder; returns the ``open_clip:local-dir:DIR`` name that loads it."""
    import open_clip
    from safetensors.torch import save

    directory = os.path.abspath(directory)
    vision = dict(image_size=TINY_IMAGE_SIZE, layers=2, width=32, head_width=16, patch_size=16)
    text = dict(context_length=32, vocab_size=49408, width=32, heads=2, layers=2)
    model_cfg = dict(embed_dim=24, vision_cfg=vision, text_cfg=text)
    preprocess = dict(
        mean=[0.48145466, 0.4578275, 0.40821073],
        std=[0.26862954, 0.26130258, 0.27577711],
        interpolation="bicubic",
        resize_mode="shortest",
    )
    config = {"model_cfg": model_cfg, "preprocess_cfg": preprocess, RANDOM_MARK: True}
    storage.write_text(f"{directory}/open_clip_config.json", json.dumps(config, indent=2))
    torch.manual_seed(seed)
    state = open_clip.CLIP(**model_cfg).eval().state_dict()
    weights = {k: v.contiguous() for k, v in state.items()}
    storage.write_bytes(f"{directory}/open_clip_model.safetensors", save(weights))  # 0644
    return f"open_clip:local-dir:{directory}"


def is_random_test_model(files: str | None) -> bool:
    """Whether the model folder ``files`` is one of these random models (its config says so)."""
    for name in ("config.json", "open_clip_config.json") if files else ():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            return json.loads(Path(files, name).read_text()).get(RANDOM_MARK) is True
    return False
