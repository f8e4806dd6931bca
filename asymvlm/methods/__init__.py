"""Every method behind one registry, ``METHODS`` (plugins included, docs/adding-a-method.md):
``build_method(name, dim, **kwargs)``. The baselines (Sec. 5, App. B.3): :mod:`.probvlm`,
:mod:`.gaussian` (PFE*, PCME++*, ProLIP*), :mod:`.elip` and :mod:`.bayesvlm`.

Importing this package imports no torch: the names (:func:`method_names`, the CLI's choices)
are known without loading a method; the rest is imported on first use."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

#: The built-in methods in registry order: name -> ``module:Class`` under this package, loaded
#: when the registry is first read (as the plugins' entry points are).
BUILTIN = {
    "asymvlm-vmf": "asymvlm:AsymVLM",
    "asymvlm-ps": "asymvlm:AsymVLMPS",
    "asymvlm-vmf-siglip": "asymvlm:AsymVLMSigLIP",
    "asymvlm-ps-siglip": "asymvlm:AsymVLMPSSigLIP",
    "asymvlm-image": "asymvlm:AsymVLMImage",
    "symvlm": "asymvlm:SymVLM",
    "asymvlm-gauss": "asymvlm:AsymVLMGauss",
    "bayesvlm": "bayesvlm:BayesVLM",
    "clip": "deterministic:FrozenCLIP",
    "determ-ft": "deterministic:DeterministicFT",
    "elip": "elip:ELIP",
    "pfe": "gaussian:PFE",
    "pcmepp": "gaussian:PCMEPP",
    "prolip": "gaussian:ProLIP",
    "probvlm": "probvlm:ProbVLM",
}
#: The entry-point group of the methods of installed packages (the entry point's name is the
#: method's name).
GROUP = "asymvlm.methods"
_LAZY = {
    "METHODS": "base",
    "Encoding": "base",
    "Method": "base",
    "Roles": "base",
    "build_method": "base",
    "check_method_name": "base",
    "method_distribution": "base",
    "check_method_kwargs": "arguments",
    "method_arguments": "arguments",
}
__all__ = ["BUILTIN", "GROUP", "method_names", *_LAZY]


def method_names() -> list[str]:
    """Every method's name, the installed plugins' included, sorted, without loading one."""
    return sorted({*BUILTIN, *(ep.name for ep in entry_points(group=GROUP))})


def __getattr__(name: str) -> Any:
    """The registry and the method interface (:data:`_LAZY`), imported on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
