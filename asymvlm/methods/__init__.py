"""Every method behind one registry, ``METHODS`` (plugins included, docs/adding-a-method.md):
``build_method(name, dim, **kwargs)``. The baselines (Sec. 5, App. B.3): :mod:`.probvlm`,
:mod:`.gaussian` (PFE*, PCME++*, ProLIP*), :mod:`.elip` and :mod:`.bayesvlm`."""

from asymvlm.methods import asymvlm, bayesvlm, deterministic, elip, gaussian, probvlm  # noqa: F401
from asymvlm.methods.arguments import check_method_kwargs, method_arguments
from asymvlm.methods.base import (
    METHODS,
    Encoding,
    Method,
    Roles,
    build_method,
    check_method_name,
    method_distribution,
    register,
)

__all__ = ["METHODS", "Encoding", "Method", "Roles", "build_method", "check_method_kwargs"]
__all__ += ["check_method_name", "method_arguments", "method_distribution", "register"]
