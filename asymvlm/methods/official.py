"""The authors' code (li-ju666/asymvlm) seen from this project: method keys, parameter names
(:func:`from_official_state_dict`, used by ``asymvlm import-official`` and the conformance tests)
and optimiser defaults per protocol (:func:`optimizer_defaults`)."""

from __future__ import annotations

from typing import Any

import torch

#: This project's method name -> the official ``--method`` key (only these six exist there).
OFFICIAL_KEYS = {m: m for m in ("asymvlm-vmf", "probvlm", "pfe", "pcmepp", "prolip")}
OFFICIAL_KEYS["asymvlm-ps"] = "asymvlm-psd"

#: Official parameter-name prefix -> ours, per method; the first match wins. The official
#: ProbVLM backbone has a dropout at index 4, so its last Linear is ``mod.5`` (ours: 4).
_PREFIXES: dict[str, dict[str, str]] = {
    "asymvlm": {
        "text_adaptor.temperature": "temperature",
        "text_adaptor.etta.": "text_adapter.net.",
    },
    "probvlm": {
        f"{theirs}_BayesCap.{a}.": f"{ours}_adapter.{b}."
        for theirs, ours in (("img", "image"), ("txt", "text"))
        for a, b in (
            ("mod.5", "backbone.4"),
            ("mod", "backbone"),
            ("block_mu", "mu_head"),
            ("block_alpha", "inv_alpha_head"),
            ("block_beta", "beta_head"),
        )
    },
    "pfe": {"image_adaptor.logvar.": "image_var_head.", "text_adaptor.logvar.": "text_var_head."},
    "pcmepp": {
        "img_enc.logvar.": "image_var_head.",
        "txt_enc.logvar.": "text_var_head.",
        "loss_func.shift": "shift",
        "loss_func.negative_scale": "scale_raw",
    },
    "prolip": {"img_enc.logvar.": "image_var_head.", "txt_enc.logvar.": "text_var_head."},
}


def our_name(method: str, official: str) -> str:
    """This project's parameter name for the official parameter ``official`` of ``method``."""
    for prefix, ours in _PREFIXES["asymvlm" if method.startswith("asymvlm") else method].items():
        if official.startswith(prefix):
            return ours + official[len(prefix) :]
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
    official = _OFFICIAL_OPTIMIZERS.get(method) if protocol == "official" else None
    return {"momentum": 0.9, **(official or _OFFICIAL_OPTIMIZERS["asymvlm"])}


def method_name(key: str) -> str:
    """This project's name for an official ``--method`` key (or for one of ours)."""
    names = {k: k for k in OFFICIAL_KEYS} | {v: k for k, v in OFFICIAL_KEYS.items()}
    if key not in names:
        known = ", ".join(sorted(names))
        raise KeyError(f"the authors' code has no method {key!r}; it has {known}")
    return names[key]


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
