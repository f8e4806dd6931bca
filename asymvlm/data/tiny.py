"""Tiny, randomly initialised CLIP / SigLIP / open_clip checkpoints that load like hub models,
offline, deterministic in ``seed`` (for tests and the offline demo: their numbers mean nothing).

CLIP and SigLIP: model + processor in one folder (``AutoModel`` / ``AutoProcessor``), with a small
BPE trained on a built-in caption vocabulary; open_clip: ``open_clip_config.json`` +
``open_clip_model.safetensors``, loaded as ``open_clip:local-dir:DIR``.
"""

from __future__ import annotations

import os
import string
from collections import Counter

import torch

from asymvlm import logs, storage

__all__ = ["save_tiny_clip", "save_tiny_open_clip", "save_tiny_siglip", "TINY_IMAGE_SIZE"]

TINY_IMAGE_SIZE = 64
_PATCH = 16
_HIDDEN = 32
_LAYERS = {
    "hidden_size": _HIDDEN,
    "intermediate_size": 2 * _HIDDEN,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}

# A small caption-like corpus: the tokenizer's vocabulary.
_BUILTIN_WORDS = (
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
    "photo picture image view close"
)


#: Every printable character alone, so that the tokenizer covers them all.
_CORPUS = [_BUILTIN_WORDS, " ".join(string.printable.strip())]


def _train_bpe(words: Counter, num_merges: int, suffix: str = "") -> list[tuple[str, str]]:
    """BPE merges, most frequent pair first, ties broken lexicographically (the ``tokenizers``
    trainer breaks ties in hash order, so its checkpoints differ from run to run)."""
    entries = [(list(w[:-1]) + [w[-1] + suffix], c) for w, c in sorted(words.items()) if w]
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


def _pretokenized(backend) -> Counter:
    words: Counter = Counter()
    for line in _CORPUS:
        text = backend.normalizer.normalize_str(line) if backend.normalizer else line
        words.update(piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text))
    return words


def _clip_tokenizer(num_merges: int = 300):
    """A byte-level BPE with CLIP's exact pipeline (``</w>`` suffix, specials at the end)."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    template = CLIPTokenizer()  # empty vocabulary: we borrow its normaliser and pre-tokeniser
    words = _pretokenized(template.backend_tokenizer)
    merges = _train_bpe(words, num_merges, suffix="</w>")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    # CLIP's vocabulary layout: bytes, bytes + "</w>", merged tokens in merge order, specials.
    vocab: dict[str, int] = {}
    for token in [*alphabet, *(c + "</w>" for c in alphabet), *(a + b for a, b in merges)]:
        vocab.setdefault(token, len(vocab))
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab.setdefault(special, len(vocab))
    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=77,
    )


def _siglip_tokenizer(num_merges: int = 300):
    """A Metaspace BPE as a plain fast tokenizer (SigLIP's own needs sentencepiece); like
    SigLIP's, ``</s>`` ends every sequence and pads, no BOS."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    pre_tokenizer = pre_tokenizers.Metaspace()
    probe = Tokenizer(models.BPE())
    probe.normalizer, probe.pre_tokenizer = normalizer, pre_tokenizer
    words = _pretokenized(probe)
    merges = _train_bpe(words, num_merges)
    vocab: dict[str, int] = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for token in [*sorted({c for w in words for c in w}), *(a + b for a, b in merges)]:
        vocab.setdefault(token, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    backend.normalizer, backend.pre_tokenizer = normalizer, pre_tokenizer
    backend.decoder = decoders.Metaspace()
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="</s>",
        pad_token="</s>",
        unk_token="<unk>",
        model_max_length=64,
    )


def _image_processor(kind: str, **kwargs):
    """The PIL-backed image processor when this transformers has one (no torchvision warning)."""
    import transformers

    cls = getattr(transformers, f"{kind}Pil", None) or getattr(transformers, kind)
    return cls(**kwargs)


def _text_ids(tok) -> dict:
    ids = {f"{k}_token_id": getattr(tok, f"{k}_token_id") for k in ("pad", "bos", "eos")}
    return {"vocab_size": len(tok), **ids}


def _save(directory: str | os.PathLike, seed: int, model_cls, config, processor) -> str:
    directory = os.fspath(directory)
    torch.manual_seed(seed)
    with logs.quiet_transformers():
        model_cls(config).eval().save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def save_tiny_clip(directory: str | os.PathLike, seed: int = 0) -> str:
    """Write a tiny random CLIP (hidden 32, 2 layers, 64 px, patch 16) and its processor."""
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor

    tok = _clip_tokenizer()
    config = CLIPConfig(
        text_config=dict(**_LAYERS, max_position_embeddings=77, **_text_ids(tok)),
        vision_config=dict(**_LAYERS, image_size=TINY_IMAGE_SIZE, patch_size=_PATCH),
        projection_dim=24,
    )
    size = {"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE}
    images = _image_processor(
        "CLIPImageProcessor", size={"shortest_edge": TINY_IMAGE_SIZE}, crop_size=size
    )
    return _save(directory, seed, CLIPModel, config, CLIPProcessor(images, tok))


def save_tiny_siglip(directory: str | os.PathLike, seed: int = 0) -> str:
    """Write a tiny random SigLIP (embedding dim 32, 64 px, patch 16) and its processor."""
    from transformers import SiglipConfig, SiglipModel, SiglipProcessor

    tok = _siglip_tokenizer()
    text = dict(**_LAYERS, max_position_embeddings=64, projection_size=_HIDDEN, **_text_ids(tok))
    config = SiglipConfig(
        text_config=text,
        vision_config=dict(**_LAYERS, image_size=TINY_IMAGE_SIZE, patch_size=_PATCH),
    )
    size = {"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE}
    images = _image_processor("SiglipImageProcessor", size=size)
    return _save(directory, seed, SiglipModel, config, SiglipProcessor(images, tok))


def save_tiny_open_clip(directory: str | os.PathLike, seed: int = 0) -> str:
    """Write a tiny random open_clip CLIP (ViT: width 32, 2 layers, 64 px, patch 16; text:
    width 32, 2 layers, open_clip's 49,408-token BPE) as a ``local-dir`` folder; returns the
    ``open_clip:local-dir:DIR`` name that loads it."""
    import json

    import open_clip
    from safetensors.torch import save_file

    directory = os.fspath(directory)
    config = {
        "model_cfg": {
            "embed_dim": 24,
            "vision_cfg": {
                "image_size": TINY_IMAGE_SIZE,
                "layers": 2,
                "width": _HIDDEN,
                "head_width": _HIDDEN // 2,
                "patch_size": _PATCH,
            },
            "text_cfg": {
                "context_length": 32,
                "vocab_size": 49408,
                "width": _HIDDEN,
                "heads": 2,
                "layers": 2,
            },
        },
        "preprocess_cfg": {
            "mean": [0.48145466, 0.4578275, 0.40821073],
            "std": [0.26862954, 0.26130258, 0.27577711],
            "interpolation": "bicubic",
            "resize_mode": "shortest",
        },
    }
    storage.write_text(
        os.path.join(directory, "open_clip_config.json"), json.dumps(config, indent=2)
    )
    torch.manual_seed(seed)
    model = open_clip.CLIP(**config["model_cfg"]).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(directory, "open_clip_model.safetensors"))
    return f"open_clip:local-dir:{os.path.abspath(directory)}"
