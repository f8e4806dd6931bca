"""Let torchvision's Python half import when its C++ operators cannot load.

PyPI's torchvision wheels for Linux are CUDA builds. Beside a CPU build of the same torch
(torch==X+cpu, as scripts/setup.sh installs where no torch is present), their ``_C`` extension
cannot load (it links libtorch_cuda), and torchvision then fails to import at all:
``torchvision/_meta_registrations.py`` registers a fake kernel for ``torchvision::nms`` without
checking that the operator exists ("RuntimeError: operator torchvision::nms does not exist";
pytorch/vision#9086 proposed the guard, pytorch/pytorch#157648 collects the reports). The
transforms that open_clip and timm use are plain Python and do not need the operators.

scripts/setup.sh installs this module into the environment's site-packages with a ``.pth`` line
that imports it at interpreter start, only when the installed torchvision fails that way. It
adds an import hook for ``torchvision`` alone and imports nothing itself: on the first
``import torchvision`` it tries to load torchvision's ``_C`` exactly as torchvision does, and if
that fails it declares the two operator schemas torchvision's registrations expect. The
detection operators (nms, roi_align, ...) then raise "no kernel" when called; nothing in this
project calls them. With a torchvision that matches torch (a CUDA torch with PyPI's
torchvision, or both from the CPU index) the hook finds the extension loadable and does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor",
)
_library = None  # the torch.library.Library holding the schemas, kept alive for the process


def _declare_operators_if_missing(search_locations: list[str]) -> None:
    global _library
    import glob
    import os

    import torch

    for location in search_locations:
        for path in sorted(glob.glob(os.path.join(location, "_C*.so"))):
            try:
                torch.ops.load_library(path)
                return  # the extension loads: torchvision defines its operators itself
            except (ImportError, OSError):
                pass
    if _library is None and not hasattr(torch.ops.torchvision, "nms"):
        _library = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _SCHEMAS:
            _library.define(schema)


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)  # once: the real finders locate the package
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.submodule_search_locations:
            try:
                _declare_operators_if_missing(list(spec.submodule_search_locations))
            except Exception:  # never make an import fail that would otherwise work
                pass
        return spec


if not any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchvisionFinder())
