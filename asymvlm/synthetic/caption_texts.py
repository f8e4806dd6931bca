"""Caption texts of the synthetic world: tag captions and captions with words (assumption W)."""

from __future__ import annotations

import numpy as np

#: Opening phrases of a word caption (1 to 4 words), equally likely.
OPENERS = ("a", "a photo of", "there is a", "this picture shows a", "an image of a")
#: Texts of the generic training captions (assumption U): other words than the dummy prompts.
GENERIC_TEXTS = (
    "a picture",
    "an image",
    "a picture of something",
    "an image of things",
    "a view of a scene",
)
#: Style words: adjectives that do not narrow a caption's objects.
FILLERS = ("small", "nice", "old", "little", "big", "some", "very", "bright", "dark", "pretty")


def caption_texts(
    path: list[np.ndarray],
    cap_image: np.ndarray,
    levels: np.ndarray,
    start: int,
    words: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> list[str]:
    """Tag captions ``"a photo of c3 / c17"`` (+ ``" / object i"`` at the object level, image
    ``start + i``); with ``words = (opener, n_fill, fill)`` (indices into :data:`OPENERS`,
    filler counts, :data:`FILLERS` indices) word captions ``"there is a small c3 c17 o5"``."""
    n_concept_levels = len(path)
    ends = np.cumsum(words[1]) if words else None
    out = []
    for c, (i, level) in enumerate(zip(cap_image, levels, strict=True)):
        tags = [f"c{path[k][i]}" for k in range(min(level + 1, n_concept_levels))]
        if words is None:
            if level == n_concept_levels:
                tags.append(f"object {start + i}")
            out.append("a photo of " + " / ".join(tags))
            continue
        opener, n_fill, fill = words
        fillers = [FILLERS[w] for w in fill[ends[c] - n_fill[c] : ends[c]]]
        tags += [f"o{start + i}"] if level == n_concept_levels else []
        out.append(" ".join([*OPENERS[opener[c]].split(), *fillers, *tags]))
    return out
