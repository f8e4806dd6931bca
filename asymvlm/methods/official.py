"""The authors' code (li-ju666/asymvlm) seen from this project: method keys, parameter names and
optimiser defaults per protocol.

* :data:`OFFICIAL_KEYS` -- this project's method name -> the official ``--method`` key.
* :func:`from_official_state_dict` -- an official adaptor's ``state_dict`` -> this project's
  parameter names (used by ``asymvlm import-official`` and the conformance tests).
* :func:`optimizer_defaults` -- optimiser, lr, momentum and weight decay of a method under a
  protocol: ``official`` = the defaults of the authors' ``train.py`` per method (SGD for
  AsymVLM and PFE, AdamW for ProbVLM, PCME++ and ProLIP); ``improved`` = the paper's text
  (SGD with momentum 0.9, weight decay 5e-4, lr 1e-2 before the grid search) for every method.
"""

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

#: (official name pattern, this project's name) per method; the first match wins. The
#: official ProbVLM backbone has a dropout (p = 0) at index 4, so its last Linear is ``mod.5``
#: where this project's two-hidden-layer MLP has index 4.
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


def official_name_map(method: str) -> list[tuple[str, str]]:
    """The (official pattern, our name) rules of ``method``; KeyError for methods the authors'
    code does not have."""
    if method not in OFFICIAL_KEYS:
        raise KeyError(
            f"the authors' code has no {method!r}; it has {', '.join(sorted(OFFICIAL_KEYS))}"
        )
    return _NAME_MAP["asymvlm" if method.startswith("asymvlm") else method]


def our_name(method: str, official: str) -> str:
    """This project's parameter name for the official ``official`` of ``method``."""
    for pattern, target in official_name_map(method):
        if re.match(pattern, official):
            name = re.sub(pattern, target, official)
            head, _, rest = name.partition(".")
            return f"{_MODALITY[head]}.{rest}" if head in _MODALITY else name
    raise KeyError(f"{method}: unexpected parameter {official!r} in an official state dict")


def from_official_state_dict(
    method: str, state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """An official adaptor's ``state_dict`` renamed (and reshaped: the official PCME++ scalars
    have shape [1]) onto ``reference``, the state dict of this project's method built under
    protocol ``official``. Buffers the official code lacks (the input scale, 1 = unscaled)
    keep the reference's values. Every official tensor must land on a reference entry of the
    same number of elements, and every reference parameter must be covered."""
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
#: The paper's text for every method (protocol ``improved``; the lr is a grid's start).
_IMPROVED_OPTIMIZER: dict[str, Any] = {
    "optimizer": "sgd",
    "lr": 1e-2,
    "momentum": 0.9,
    "weight_decay": 5e-4,
}


def optimizer_defaults(method: str, protocol: str) -> dict[str, Any]:
    """``{"optimizer", "lr", "momentum", "weight_decay"}`` of ``method`` under ``protocol``.

    ``official``: the authors' per-method defaults; methods their code lacks (the ablations,
    SigLIP variants, ELIP, Determ. FT) take AsymVLM's (SGD 1e-2), as the paper trains them.
    ``momentum`` is 0.9 wherever AdamW ignores it.
    """
    if protocol == "official":
        picked = _OFFICIAL_OPTIMIZERS.get(method, _OFFICIAL_OPTIMIZERS["asymvlm"])
        return {"momentum": 0.9, **picked}
    return dict(_IMPROVED_OPTIMIZER)


def method_name(key: str) -> str:
    """This project's name for an official ``--method`` key (or for one of ours)."""
    ours = {official: name for name, official in OFFICIAL_KEYS.items()}
    if key in ours:
        return ours[key]
    if key in OFFICIAL_KEYS:
        return key
    known = sorted(set(OFFICIAL_KEYS) | set(ours))
    raise KeyError(f"the authors' code has no method {key!r}; it has {', '.join(known)}")


def official_dim(method: str, state: dict[str, torch.Tensor]) -> int:
    """The embedding dimension of an official state dict: the input width of its first layer."""
    first = next(name for name in state if name.endswith(".0.weight"))
    return int(state[first].shape[1])


def load_official(method: str, state: dict[str, torch.Tensor]) -> Any:
    """This project's ``method`` under protocol ``official`` holding the official weights
    ``state`` (a ``torch.save(adaptor.state_dict())`` of the authors' train.py)."""
    from asymvlm.methods.base import build_method

    model = build_method(method, official_dim(method, state), protocol="official")
    reference = model.state_dict()
    model.load_state_dict(from_official_state_dict(method, state, reference))
    return model
