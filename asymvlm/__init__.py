"""AsymVLM: asymmetric probabilistic adaptation of vision-language models (Ju et al., NeurIPS 2025).

The science lives here and runs without Ray: distributions, methods, metrics, tables, the
synthetic world, training, evaluation and checkpoints; the Ray layer is :mod:`asymvlm_ray`.
docs/development.md ("Layout") gives the layers, which ``lint-imports`` holds."""

__version__ = "0.1.0"

#: The public API (``docs/api.md``): name -> the module that defines it, imported on first use
#: so that ``import asymvlm`` stays light.
_API = {
    "train": "asymvlm.runner.single",
    "evaluate": "asymvlm.api",
    "score": "asymvlm.api",
    "load_checkpoint": "asymvlm.api",
    "TrainConfig": "asymvlm.training",
    "Scorer": "asymvlm.scoring",
    "CaptionScores": "asymvlm.scoring",
    "Index": "asymvlm.indexing",
    "build_index": "asymvlm.indexing",
    "search": "asymvlm.api",
}

__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    """The public API's functions and classes (:data:`_API`), imported on first use."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'asymvlm' has no attribute {name!r}")
