"""Splits loaded once per process: :class:`SplitCache`.

A sweep runs many trials on the same tables. Reading and validating a split (Parquet -> one
tensor on the device) is the same work for every trial, so a process that runs several trials
(a Tune actor reused from trial to trial) keeps the splits it loaded and hands every later
trial the same tensors. Nothing in a run writes into them: the trainer indexes them (copies)
and methods build their own inputs from them.

The key is (tables root, split, adapter input, device) plus the manifest's content, so tables
rewritten in place under a long-lived process are read again rather than served stale.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

import torch

from asymvlm import tables
from asymvlm.training.data import SplitTensors, load_split

T = TypeVar("T")

class SplitCache:
    """Least-recently-used splits on their devices, at most ``max_entries`` of them.

    :meth:`load` is :func:`~asymvlm.training.load_split` memoised; :meth:`memo` keeps what is
    derived from a split (the protocol's held-out validation part, which depends only on the
    image ids). ``hits`` and ``misses`` count lookups."""

    def __init__(self, max_entries: int = 6) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def _key(self, root: str, *rest: object) -> tuple:
        manifest = json.dumps(tables.read_manifest(root).to_dict(), sort_keys=True, default=str)
        return (root, manifest, *rest)

    def _get(self, key: tuple, make: Callable[[], T]) -> T:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key]
        value = make()
        with self._lock:
            self.misses += 1
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value

    def load(
        self, root: str, split: str, adapter_input: str = "raw",
        device: str | torch.device = "cpu",
    ) -> SplitTensors:  # fmt: skip
        """``load_split(root, split, adapter_input, device)``, read once per process."""
        device = torch.device(device)
        key = self._key(root, "split", split, adapter_input, str(device))
        return self._get(key, lambda: load_split(root, split, adapter_input, device))

    def memo(self, root: str, key: tuple, make: Callable[[], T]) -> T:
        """``make()`` once per (tables ``root`` and its manifest, ``key``): for what is derived
        from a split, e.g. its held-out validation part."""
        return self._get(self._key(root, *key), make)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


#: The cache of this process (a Tune actor running one trial after another).
PROCESS_CACHE = SplitCache()
