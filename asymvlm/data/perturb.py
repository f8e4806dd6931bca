"""Input perturbations ``"kind:severity"`` of the OOD robustness suite (docs/data.md)."""

from __future__ import annotations

import hashlib
import io
import string
from collections.abc import Callable

import numpy as np


def item_seed(seed: int, item_id: str) -> int:
    """A per-item seed from the run seed and the item's id (independent of batching)."""
    digest = hashlib.sha256(f"{seed}:{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _gaussian_noise(image, severity: int, rng: np.random.Generator):
    from PIL import Image

    sigma = (0.04, 0.06, 0.08, 0.09, 0.10)[severity - 1]
    x = np.asarray(image, dtype=np.float32) / 255.0
    x = np.clip(x + rng.normal(0.0, sigma, x.shape), 0.0, 1.0)
    return Image.fromarray((x * 255.0 + 0.5).astype(np.uint8))


def _rotation(image, severity: int, rng: np.random.Generator):
    angle = (5.0, 10.0, 15.0, 20.0, 30.0)[severity - 1] * (1 if rng.random() < 0.5 else -1)
    return image.rotate(angle, resample=3, fillcolor=(0, 0, 0))  # bicubic


def _zoom_blur(image, severity: int, rng: np.random.Generator):
    from PIL import Image

    top, step = ((1.11, 0.01), (1.16, 0.01), (1.21, 0.02), (1.26, 0.02), (1.31, 0.03))[severity - 1]
    w, h = image.size
    acc = np.asarray(image, dtype=np.float32).copy()
    zooms = np.arange(1.0 + step, top, step)
    for z in zooms:
        zw, zh = int(round(w * z)), int(round(h * z))
        big = image.resize((zw, zh), resample=3)
        left, upper = (zw - w) // 2, (zh - h) // 2
        acc += np.asarray(big.crop((left, upper, left + w, upper + h)), dtype=np.float32)
    acc /= len(zooms) + 1
    return Image.fromarray(np.clip(acc, 0, 255).astype(np.uint8))


def _jpeg(image, severity: int, rng: np.random.Generator):
    from PIL import Image

    quality = (25, 18, 15, 10, 7)[severity - 1]
    image.save(buffer := io.BytesIO(), format="JPEG", quality=quality)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def _low_resolution(image, severity: int, rng: np.random.Generator):
    factor = (2, 3, 4, 6, 8)[severity - 1]
    w, h = image.size
    small = image.resize((max(1, w // factor), max(1, h // factor)), resample=2)  # bilinear
    return small.resize((w, h), resample=0)  # nearest: blocky, as an upscaled thumbnail


IMAGE_PERTURBATIONS: dict[str, Callable] = {
    f.__name__[1:]: f for f in (_gaussian_noise, _rotation, _zoom_blur, _jpeg, _low_resolution)
}


def _typos(text: str, severity: int, rng: np.random.Generator) -> str:
    p = (0.02, 0.05, 0.08, 0.12, 0.16)[severity - 1]
    chars, out, i = list(text), [], 0
    letters = string.ascii_lowercase
    while i < len(chars):
        c = chars[i]
        if c.isalpha() and rng.random() < p:
            op = rng.integers(4)
            if op == 0 and i + 1 < len(chars):  # swap with the next character
                out += [chars[i + 1], c]
                i += 2
                continue
            if op == 1:  # drop
                i += 1
                continue
            if op == 2:  # insert
                out += [c, letters[rng.integers(26)]]
            else:  # replace
                out.append(letters[rng.integers(26)])
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _word_order(text: str, severity: int, rng: np.random.Generator) -> str:
    words = text.split()
    if len(words) < 2:
        return text
    swaps = max(1, int(round((0.1, 0.2, 0.3, 0.4, 0.5)[severity - 1] * len(words))))
    for _ in range(swaps):
        j = int(rng.integers(len(words) - 1))
        words[j], words[j + 1] = words[j + 1], words[j]
    return " ".join(words)


_SYNONYM_TABLE = """
man=guy|gentleman|male woman=lady|female men=guys women=ladies person=individual|human
people=persons|folks child=kid|youngster children=kids boy=lad|kid girl=lass|kid
dog=puppy|canine|hound cat=kitty|feline car=automobile|vehicle picture=photo|image
photo=picture image=picture large=big|huge big=large|huge small=little|tiny little=small
street=road road=street standing=upright sitting=seated walking=strolling riding=on
holding=carrying|gripping looking=gazing|staring table=desk plate=dish food=meal|dish
building=structure near=close_to|by next=beside top=upper_part water=sea field=meadow
grass=lawn bike=bicycle bicycle=bike train=locomotive bus=coach room=chamber
kitchen=cookhouse white=pale black=dark red=crimson blue=azure green=verdant young=youthful
old=elderly|aged playing=toying eating=consuming
"""
#: Caption vocabulary -> near-synonyms (common COCO/CC words).
SYNONYMS: dict[str, tuple[str, ...]] = {
    word: tuple(o.replace("_", " ") for o in options.split("|"))
    for word, _, options in (entry.partition("=") for entry in _SYNONYM_TABLE.split())
}


def _synonyms(text: str, severity: int, rng: np.random.Generator) -> str:
    share = (0.2, 0.4, 0.6, 0.8, 1.0)[severity - 1]
    out = []
    for word in text.split():
        core = word.strip(string.punctuation)
        options = SYNONYMS.get(core.lower())
        if options and rng.random() < share:
            new = options[int(rng.integers(len(options)))]
            if core[:1].isupper():
                new = new.capitalize()
            word = word.replace(core, new)
        out.append(word)
    return " ".join(out)


def _casing(text: str, severity: int, rng: np.random.Generator) -> str:
    p = (0.1, 0.2, 0.3, 0.4, 0.5)[severity - 1]
    out = []
    for word in text.split():
        r = rng.random()
        if r < p / 2:
            word = word.upper()
        elif r < p:
            word = word.swapcase()
        if rng.random() < p / 2:
            word += "!?.,;"[int(rng.integers(5))]
        elif rng.random() < p / 2:
            word = word.strip(string.punctuation) or word
        out.append(word)
    return " ".join(out)


CAPTION_PERTURBATIONS: dict[str, Callable] = {
    f.__name__[1:]: f for f in (_typos, _word_order, _synonyms, _casing)
}


def parse_perturbation(spec: str, kinds: dict[str, Callable]) -> tuple[str, int]:
    """``"kind:severity"`` -> (kind, severity), checked against ``kinds``."""
    kind, sep, level = spec.partition(":")
    if kind not in kinds or not sep or level not in ("1", "2", "3", "4", "5"):
        raise ValueError(
            f"perturbation {spec!r}: expected KIND:SEVERITY with KIND in {sorted(kinds)} "
            f"and SEVERITY in 1-5"
        )
    return kind, int(level)


def perturb_image(image, spec: str, seed: int):
    """Apply ``spec`` (e.g. ``"jpeg:3"``) to an RGB PIL image, deterministically in ``seed``."""
    kind, severity = parse_perturbation(spec, IMAGE_PERTURBATIONS)
    return IMAGE_PERTURBATIONS[kind](image.convert("RGB"), severity, np.random.default_rng(seed))


def perturb_caption(text: str, spec: str, seed: int) -> str:
    """Apply ``spec`` (e.g. ``"typos:2"``) to a caption, deterministically in ``seed``."""
    kind, severity = parse_perturbation(spec, CAPTION_PERTURBATIONS)
    return CAPTION_PERTURBATIONS[kind](text, severity, np.random.default_rng(seed))
