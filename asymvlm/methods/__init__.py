"""Every method of the paper behind one registry: ``build_method(name, dim, **kwargs)``.

Importing this package registers them all; ``METHODS`` maps names to classes.
"""

from asymvlm.methods import asymvlm as _asymvlm  # noqa: F401  (registers)
from asymvlm.methods import baselines as _baselines  # noqa: F401
from asymvlm.methods import bayesvlm as _bayesvlm  # noqa: F401
from asymvlm.methods import deterministic as _deterministic  # noqa: F401
from asymvlm.methods.base import (
    METHODS,
    Encoding,
    Method,
    build_method,
    check_method_name,
    register,
)

__all__ = ["METHODS", "Encoding", "Method", "build_method", "check_method_name", "register"]
