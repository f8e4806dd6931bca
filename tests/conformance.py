"""The conformance vectors of the authors' code: ``$ASYMVLM_CONFORMANCE``, else
``../shared/conformance`` beside this checkout; ``inputs_seed<S>.npz`` and ``<method>_seed<S>.npz``
per seed; weights rebuilt from the seed and checked against their SHA-256 digests."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
#: The vectors' method file stems (this project's method names).
METHODS = ("asymvlm-vmf", "asymvlm-ps", "probvlm", "pfe", "pcmepp", "prolip")


def folder() -> Path | None:
    """The conformance folder, or None when absent."""
    for candidate in (
        os.environ.get("ASYMVLM_CONFORMANCE"),
        REPO.parent / "shared" / "conformance",
    ):
        if candidate and Path(candidate, "manifest.json").is_file():
            return Path(candidate)
    return None


def cases() -> list[tuple[str, int]]:
    """(method, seed) for every method file present."""
    root = folder()
    if root is None:
        return []
    found = (re.fullmatch(r"(.+)_seed(\d+)\.npz", p.name) for p in sorted(root.glob("*_seed*.npz")))
    return [(m.group(1), int(m.group(2))) for m in found if m and m.group(1) in METHODS]


def load(method: str, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the method's arrays, the seed's inputs), loaded without pickle."""
    root = folder()
    assert root is not None
    with np.load(root / f"{method}_seed{seed}.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    with np.load(root / f"inputs_seed{seed}.npz", allow_pickle=False) as z:
        inputs = {k: z[k] for k in z.files}
    return arrays, inputs


def _sha256_float32(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().numpy().astype("<f4", copy=False).tobytes()).hexdigest()


def official_state_dict(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The official parameters (float64, official names): weights rebuilt from the seed and
    verified bit-exactly against their digests, biases verified against the stored values."""
    names = [str(n) for n in arrays["init/linear_weight_names"]]
    shapes = arrays["init/linear_out_in"]
    state: dict[str, torch.Tensor] = {}
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        torch.manual_seed(int(arrays["init/seed"]))
        layers = [nn.Linear(int(d_in), int(d_out)) for d_out, d_in in shapes]
    finally:
        torch.set_default_dtype(default)
    for name, layer in zip(names, layers, strict=True):
        digest = str(arrays[f"param_digest/{name}/sha256_float32_le"])
        if _sha256_float32(layer.weight) != digest:
            raise AssertionError(f"rebuilt {name} does not match its digest")
        bias = name[: -len("weight")] + "bias"
        if not np.array_equal(layer.bias.detach().double().numpy(), arrays[f"param/{bias}"]):
            raise AssertionError(f"rebuilt {bias} differs from the stored one")
        state[name] = layer.weight.detach().double()
        state[bias] = layer.bias.detach().double()
    for name in (str(n) for n in arrays["init/param_names"]):
        if name not in state:
            state[name] = torch.as_tensor(arrays[f"param/{name}"], dtype=torch.float64)
    return state
