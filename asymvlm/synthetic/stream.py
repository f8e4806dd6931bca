"""Drawing a split window by window with the very numbers of the one-piece draw: one pass over
each generator records its state where every window's numbers begin (numpy draws the same
numbers at once or in consecutive calls). Windows have at least :data:`MIN_WINDOW_IMAGES`
images, so that BLAS rounds their matrix products as it rounds the whole split's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MIN_WINDOW_IMAGES", "WINDOW_IMAGES", "Phase", "SplitStream", "windows"]

#: Images per window when an unblocked split is drawn piece by piece.
WINDOW_IMAGES = 2048
#: The fewest images of a window (a shorter tail joins the window before it).
MIN_WINDOW_IMAGES = 256

#: ``draw(phase, count)``: the phase's next ``count`` numbers (rows) for the window drawn.
DrawFn = Callable[[str, int], np.ndarray]


@dataclass(frozen=True)
class Phase:
    """One random quantity: its stream (``role``), its count per window (``unit``: ``image``,
    ``caption`` or ``sum`` of the previous phase's values) and how ``count`` values are drawn."""

    role: str
    unit: str
    draw: Callable[[np.random.Generator, int], np.ndarray]


def windows(
    n_images: int, size: int = WINDOW_IMAGES, smallest: int = MIN_WINDOW_IMAGES
) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` windows of ``size`` images; a short tail joins the one before."""
    if size < 1:
        raise ValueError(f"window size must be >= 1, got {size}")
    bounds = [*range(0, n_images, size), n_images]
    pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
    if len(pairs) > 1 and pairs[-1][1] - pairs[-1][0] < smallest:
        pairs[-2:] = [(pairs[-2][0], n_images)]
    return pairs


class SplitStream:
    """The states of a split's generators at the start of every window, phase by phase
    (``phases`` in the order of the draws; construction draws every number once)."""

    def __init__(
        self,
        generators: dict[str, Callable[[], np.random.Generator]],
        phases: dict[str, Phase],
        bounds: list[tuple[int, int]],
        captions_per_image: int,
    ) -> None:
        self._phases = phases
        self._index = {start: k for k, (start, _) in enumerate(bounds)}
        self._states: dict[str, list[dict[str, Any]]] = {}
        self._bit_generator: dict[str, type] = {}
        for role, make in generators.items():
            rng = make()
            self._bit_generator[role] = type(rng.bit_generator)
            names = [name for name, phase in phases.items() if phase.role == role]
            sums: list[int] = []
            for i, name in enumerate(names):
                phase = phases[name]
                wants_sum = i + 1 < len(names) and phases[names[i + 1]].unit == "sum"
                states, next_sums = [], []
                for k, (start, stop) in enumerate(bounds):
                    states.append(rng.bit_generator.state)
                    values = phase.draw(
                        rng, self._count(phase, start, stop, captions_per_image, sums, k)
                    )
                    if wants_sum:
                        next_sums.append(int(values.sum()))
                self._states[name] = states
                sums = next_sums

    @staticmethod
    def _count(phase: Phase, start: int, stop: int, n_cap: int, sums: list[int], k: int) -> int:
        if phase.unit == "image":
            return stop - start
        if phase.unit == "caption":
            return (stop - start) * n_cap
        return sums[k]

    def draws(self, start: int) -> DrawFn:
        """``draw(phase, count)`` for the window starting at image ``start``."""
        k = self._index[start]

        def draw(name: str, count: int) -> np.ndarray:
            phase = self._phases[name]
            bit_generator = self._bit_generator[phase.role](0)
            bit_generator.state = self._states[name][k]
            return phase.draw(np.random.Generator(bit_generator), count)

        return draw
