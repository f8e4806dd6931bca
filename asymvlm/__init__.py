"""AsymVLM: asymmetric probabilistic adaptation of vision-language models (Ju et al., NeurIPS 2025).

The science lives here and runs without Ray: spherical distributions (:mod:`asymvlm.distributions`),
every method of the paper behind one registry (:mod:`asymvlm.methods`), the paper's metrics
(:mod:`asymvlm.metrics`), the embedding-table contract (:mod:`asymvlm.tables`), a synthetic world
(:mod:`asymvlm.synthetic`), the trainers (:mod:`asymvlm.training`), the protocol of a run
(:mod:`asymvlm.protocol`), its evaluations (:mod:`asymvlm.evaluation`) and checkpoints
(:mod:`asymvlm.checkpoints`). The Ray layer is ``pipelines/``; the README's "Layout" gives the
layers, which ``lint-imports`` holds.
"""

__version__ = "0.1.0"

__all__ = ["CaptionScores", "Scorer", "__version__"]


def __getattr__(name: str):
    """``asymvlm.Scorer`` (text in, uncertainty out: :mod:`asymvlm.scoring`), imported on first
    use so that ``import asymvlm`` stays light."""
    if name in ("Scorer", "CaptionScores"):
        from asymvlm import scoring

        return getattr(scoring, name)
    raise AttributeError(f"module 'asymvlm' has no attribute {name!r}")
