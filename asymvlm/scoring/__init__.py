"""Text in, uncertainty out: :class:`Scorer`, :class:`TableEncoder` (captions looked up in tables)
and, in :mod:`~asymvlm.scoring.models`, the adapter as MLflow models."""

from asymvlm.scoring.scorer import CaptionScores, Scorer, ScoringInputError, TableEncoder

__all__ = ["CaptionScores", "Scorer", "ScoringInputError", "TableEncoder"]
