"""Text in, uncertainty out: :class:`Scorer` (``asymvlm score-text``, the Serve deployment),
:class:`TableEncoder` (captions looked up in tables without an encoder) and, in
:mod:`~asymvlm.scoring.models`, the adapter as MLflow models."""

from asymvlm.scoring.scorer import CaptionScores, Scorer, ScoringInputError, TableEncoder

__all__ = ["CaptionScores", "Scorer", "ScoringInputError", "TableEncoder"]
