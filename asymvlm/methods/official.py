"""The authors' code (li-ju666/asymvlm) seen from this project: method keys, parameter names
(:func:`from_official_state_dict`, used by ``asymvlm import-official`` and the conformance tests)
and optimiser defaults per protocol (:func:`optimizer_defaults`)."""

from __future__ import annotations

import re
from typing import Any

import torch

#: This project's method name -> the official ``--method`` key (only these six exist there).
OFFICIAL_KEYS = {
    "asymvlm-vmf": "asymvlm-vmf",
    "asymvlm-ps": "asymvlm-psd",
    "probvlm": "probvlm",
    "pfe": "pfe",
    "pcmepp": "pcmepp",
    "prolip": "prolip",
}

#: (official name pattern, this project's name) per method; the first match wins. The official
#: ProbVLM backbone has a dropout at index 4, so its last Linear is ``mod.5`` (ours: 4).
_NAME_MAP: dict[str, list[tuple[str, str]]] = {
    "asymvlm": [
        (r"^text_adaptor\.temperature$", "temperature"),
        (r"^text_adaptor\.etta\.(\d+)\.(weight|bias)$", r"text_adapter.net.\1.\2"),
    ],
    "probvlm": [
        (r"^(img|txt)_BayesCap\.mod\.5\.(weight|bias)$", r"\1.backbone.4.\2"),
        (r"^(img|txt)_BayesCap\.mod\.(\d+)\.(weight|bias)$", r"\1.backbone.\2.\3"),
        (r"^(img|txt)_BayesCap\.block_mu\.(\d+)\.(weight|bias)$", r"\1.mu_head.\2.\3"),
        (r"^(img|txt)_BayesCap\.block_alpha\.(\d+)\.(weight|bias)$", r"\1.inv_alpha_head.\2.\3"),
        (r"^(img|txt)_BayesCap\.block_beta\.(\d+)\.(weight|bias)$", r"\1.beta_head.\2.\3"),
    ],
    "pfe": [
        (r"^image_adaptor\.logvar\.(\d+)\.(weight|bias)$", r"image_var_head.\1.\2"),
        (r"^text_adaptor\.logvar\.(\d+)\.(weight|bias)$", r"text_var_head.\1.\2"),
    ],
    "pcmepp": [
        (r"^img_enc\.logvar\.(\d+)\.(weight|bias)$", r"image_var_head.\1.\2"),
        (r"^txt_enc\.logvar\.(\d+)\.(weight|bias)$", r"text_var_head.\1.\2"),
        (r"^loss_func\.shift$", "shift"),
        (r"^loss_func\.negative_scale$", "scale_raw"),
    ],
}
_NAME_MAP["prolip"] = _NAME_MAP["pcmepp"][:2]
_MODALITY = {"img": "image_adapter", "txt": "text_adapter"}


def our_name(method: str, official: str) -> str:
    """This project's parameter name for the official parameter ``official`` of ``method``."""
    if method not in OFFICIAL_KEYS:
        raise KeyError(
            f"the authors' code has no {method!r}; it has {', '.join(sorted(OFFICIAL_KEYS))}"
        )
    for pattern, target in _NAME_MAP["asymvlm" if method.startswith("asymvlm") else method]:
        if re.match(pattern, official):
            name = re.sub(pattern, target, official)
            head, _, rest = name.partition(".")
            return f"{_MODALITY[head]}.{rest}" if head in _MODALITY else name
    raise KeyError(f"{method}: unexpected parameter {official!r} in an official state dict")


def from_official_state_dict(
    method: str, state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """An official ``state_dict`` renamed and reshaped onto ``reference`` (this project's
    ``official`` method's state dict); every reference parameter but the input scale (1 =
    unscaled) must be covered, each by a tensor of as many elements."""
    out = dict(reference)
    covered: set[str] = set()
    for name, value in state.items():
        target = our_name(method, name)
        if target not in reference:
            raise KeyError(f"{method}: {name!r} maps to {target!r}, which the model lacks")
        ref = reference[target]
        if value.numel() != ref.numel():
            raise ValueError(
                f"{method}: {name!r} has shape {tuple(value.shape)}, the model's {target!r} "
                f"{tuple(ref.shape)} (another hidden width or depth?)"
            )
        out[target] = value.detach().reshape(ref.shape).to(ref.dtype)
        covered.add(target)
    missing = [k for k in reference if k not in covered and not k.endswith("input_scale")]
    if missing:
        raise KeyError(f"{method}: the official state dict lacks {', '.join(missing)}")
    return out


#: Optimiser defaults of the authors' train.py per method (protocol ``official``).
_OFFICIAL_OPTIMIZERS: dict[str, dict[str, Any]] = {
    "asymvlm": {"optimizer": "sgd", "lr": 1e-2, "momentum": 0.9, "weight_decay": 5e-4},
    "probvlm": {"optimizer": "adamw", "lr": 1e-4, "weight_decay": 5e-4},
    "pfe": {"optimizer": "sgd", "lr": 1e-3, "momentum": 0.9, "weight_decay": 5e-4},
    "pcmepp": {"optimizer": "adamw", "lr": 5e-4, "weight_decay": 1e-4},
    "prolip": {"optimizer": "adamw", "lr": 5e-4, "weight_decay": 5e-4},
}


def optimizer_defaults(method: str, protocol: str) -> dict[str, Any]:
    """``{"optimizer", "lr", "momentum", "weight_decay"}`` of ``method`` under ``protocol``:
    the authors' per-method defaults (``official``; AsymVLM's for methods their code lacks) or
    the paper's SGD (momentum 0.9, weight decay 5e-4, lr 1e-2) for every method (``improved``)."""
    if protocol == "official":
        return {
            "momentum": 0.9,
            **_OFFICIAL_OPTIMIZERS.get(method, _OFFICIAL_OPTIMIZERS["asymvlm"]),
        }
    return dict(_OFFICIAL_OPTIMIZERS["asymvlm"])


def method_name(key: str) -> str:
    """This project's name for an official ``--method`` key (or for one of ours)."""
    ours = {official: name for name, official in OFFICIAL_KEYS.items()}
    if key in ours or key in OFFICIAL_KEYS:
        return ours.get(key, key)
    known = sorted(set(OFFICIAL_KEYS) | set(ours))
    raise KeyError(f"the authors' code has no method {key!r}; it has {', '.join(known)}")


def official_dim(method: str, state: dict[str, torch.Tensor]) -> int:
    """The embedding dimension of an official state dict: its first layer's input width."""
    first = next(name for name in state if name.endswith(".0.weight"))
    return int(state[first].shape[1])


def load_official(method: str, state: dict[str, torch.Tensor]) -> Any:
    """This project's ``method`` under protocol ``official`` holding the official weights."""
    from asymvlm.methods.base import build_method

    model = build_method(method, official_dim(method, state), protocol="official")
    model.load_state_dict(from_official_state_dict(method, state, model.state_dict()))
    return model
