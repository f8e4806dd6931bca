"""Tiny, randomly initialised CLIP / SigLIP / open_clip checkpoints that load like hub models,
offline.

They exist for tests and for the offline demo: the weights are random, so any number computed
with them is clearly not meaningful science. Each builder trains a small tokenizer with the
``tokenizers`` library, builds the model from a config, and saves model + processor into one
directory so that ``AutoModel.from_pretrained(d)`` and ``AutoProcessor.from_pretrained(d)`` work
with no network. :func:`save_tiny_open_clip` writes an open_clip folder instead
(``open_clip_config.json`` + ``open_clip_model.safetensors``, loaded as
``open_clip:local-dir:DIR``); it uses open_clip's own BPE tokenizer. Output is deterministic
given ``captions`` and ``seed``.
"""

from __future__ import annotations

import os
import string
from collections import Counter
from collections.abc import Iterable

import torch

from asymvlm import logs

__all__ = ["save_tiny_clip", "save_tiny_open_clip", "save_tiny_siglip", "TINY_IMAGE_SIZE"]

TINY_IMAGE_SIZE = 64
_PATCH = 16
_HIDDEN = 32

# A small caption-like corpus so the tokenizer has a vocabulary even without captions.
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


def _corpus(captions: Iterable[str] | None) -> list[str]:
    lines = [] if captions is None else [str(c) for c in captions]
    lines.append(_BUILTIN_WORDS)
    lines.append(" ".join(string.printable.strip()))  # every printable character, alone
    return lines


def _train_bpe(words: Counter, num_merges: int, suffix: str = "") -> list[tuple[str, str]]:
    """Deterministic BPE merges: most frequent pair first, ties broken lexicographically.

    The ``tokenizers`` trainer breaks ties between equally frequent pairs in hash order, which
    changes from run to run, so the tiny checkpoints would not be byte-identical for a seed.
    """
    entries: list[list[str]] = []
    counts: list[int] = []
    for word, count in sorted(words.items()):
        if word:
            symbols = list(word)
            symbols[-1] += suffix
            entries.append(symbols)
            counts.append(count)
    pairs: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = {}

    def account(i: int, sign: int) -> None:
        for pair in zip(entries[i], entries[i][1:], strict=False):
            pairs[pair] += sign * counts[i]
            if sign > 0:
                where.setdefault(pair, set()).add(i)

    for i in range(len(entries)):
        account(i, +1)
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        live = [p for p, c in pairs.items() if c > 0]
        if not live:
            break
        best = min(live, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for i in sorted(where.pop(best, ())):
            account(i, -1)
            symbols, out, j = entries[i], [], 0
            while j < len(symbols):
                if j + 1 < len(symbols) and (symbols[j], symbols[j + 1]) == best:
                    out.append(symbols[j] + symbols[j + 1])
                    j += 2
                else:
                    out.append(symbols[j])
                    j += 1
            entries[i] = out
            account(i, +1)
    return merges


def _pretokenized(backend, lines: list[str]) -> Counter:
    words: Counter = Counter()
    for line in lines:
        text = backend.normalizer.normalize_str(line) if backend.normalizer else line
        words.update(piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text))
    return words


def _clip_tokenizer(captions: Iterable[str] | None, num_merges: int):
    """A byte-level BPE with CLIP's exact pipeline (``</w>`` suffix, specials at the end)."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    template = CLIPTokenizer()  # empty vocabulary: we borrow its normaliser and pre-tokeniser
    words = _pretokenized(template.backend_tokenizer, _corpus(captions))
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


def _siglip_tokenizer(captions: Iterable[str] | None, num_merges: int):
    """A Metaspace BPE wrapped as a plain fast tokenizer (SigLIP's own needs sentencepiece).

    Like SigLIP's: ``</s>`` appended to every sequence and used as the pad token; no BOS.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    pre_tokenizer = pre_tokenizers.Metaspace()
    probe = Tokenizer(models.BPE())
    probe.normalizer, probe.pre_tokenizer = normalizer, pre_tokenizer
    words = _pretokenized(probe, _corpus(captions))
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
    return dict(
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )


def _layers(hidden: int) -> dict:
    return dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
    )


def save_tiny_clip(
    directory: str | os.PathLike,
    captions: list[str] | None = None,
    seed: int = 0,
    projection_dim: int = 24,
    num_merges: int = 300,
) -> str:
    """Write a tiny random CLIP (hidden 32, 2 layers, 64 px, patch 16) and its processor."""
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor

    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    tok = _clip_tokenizer(captions, num_merges)
    config = CLIPConfig(
        text_config=dict(**_layers(_HIDDEN), max_position_embeddings=77, **_text_ids(tok)),
        vision_config=dict(**_layers(_HIDDEN), image_size=TINY_IMAGE_SIZE, patch_size=_PATCH),
        projection_dim=projection_dim,
    )
    torch.manual_seed(seed)
    model = CLIPModel(config).eval()
    with logs.quiet_transformers():
        model.save_pretrained(directory)
    processor = CLIPProcessor(
        image_processor=_image_processor(
            "CLIPImageProcessor",
            size={"shortest_edge": TINY_IMAGE_SIZE},
            crop_size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE},
        ),
        tokenizer=tok,
    )
    processor.save_pretrained(directory)
    return directory


def save_tiny_siglip(
    directory: str | os.PathLike,
    captions: list[str] | None = None,
    seed: int = 0,
    hidden_size: int = _HIDDEN,
    num_merges: int = 300,
) -> str:
    """Write a tiny random SigLIP (embedding dim = ``hidden_size``, 64 px, patch 16)."""
    from transformers import SiglipConfig, SiglipModel, SiglipProcessor

    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    tok = _siglip_tokenizer(captions, num_merges)
    config = SiglipConfig(
        text_config=dict(
            **_layers(hidden_size),
            max_position_embeddings=64,
            projection_size=hidden_size,
            **_text_ids(tok),
        ),
        vision_config=dict(**_layers(hidden_size), image_size=TINY_IMAGE_SIZE, patch_size=_PATCH),
    )
    torch.manual_seed(seed)
    model = SiglipModel(config).eval()
    with logs.quiet_transformers():
        model.save_pretrained(directory)
    processor = SiglipProcessor(
        image_processor=_image_processor(
            "SiglipImageProcessor",
            size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE},
        ),
        tokenizer=tok,
    )
    processor.save_pretrained(directory)
    return directory


def save_tiny_open_clip(
    directory: str | os.PathLike, seed: int = 0, embed_dim: int = 24, context_length: int = 32
) -> str:
    """Write a tiny random open_clip CLIP (ViT: width 32, 2 layers, 64 px, patch 16; text:
    width 32, 2 layers, open_clip's 49,408-token BPE) as a ``local-dir`` folder; returns the
    ``open_clip:local-dir:DIR`` name that loads it."""
    import json

    import open_clip
    from safetensors.torch import save_file

    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    config = {
        "model_cfg": {
            "embed_dim": embed_dim,
            "vision_cfg": {
                "image_size": TINY_IMAGE_SIZE,
                "layers": 2,
                "width": _HIDDEN,
                "head_width": _HIDDEN // 2,
                "patch_size": _PATCH,
            },
            "text_cfg": {
                "context_length": context_length,
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
    with open(os.path.join(directory, "open_clip_config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    torch.manual_seed(seed)
    model = open_clip.CLIP(**config["model_cfg"]).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(directory, "open_clip_model.safetensors"))
    return f"open_clip:local-dir:{os.path.abspath(directory)}"


def main(argv: list[str] | None = None) -> None:
    """``python -m asymvlm.data.tiny --output DIR [--family siglip]``: a random offline model."""
    import argparse

    parser = argparse.ArgumentParser(
        description="Write a tiny, randomly initialised CLIP/SigLIP with its processor, or an "
        "open_clip folder (offline; "
        "for tests and demos -- its embeddings carry no meaning)."
    )
    parser.add_argument("--output", required=True)
    parser.add_argument("--family", choices=["clip", "siglip", "open_clip"], default="clip")
    parser.add_argument("--captions", default=None, help="CSV/text file to train the tokenizer on")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    captions = None
    if args.captions:
        with open(args.captions) as fh:
            captions = [line.strip() for line in fh if line.strip()]
    if args.family == "open_clip":
        print(save_tiny_open_clip(args.output, seed=args.seed))
        return
    save = save_tiny_clip if args.family == "clip" else save_tiny_siglip
    print(save(args.output, captions=captions, seed=args.seed))


if __name__ == "__main__":
    main()
