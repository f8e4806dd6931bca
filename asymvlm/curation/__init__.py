"""κ for every caption of an image-text pool, and selections by it (docs/curate.md): the pools'
formats (:mod:`.pools`), one shard's scores (:mod:`.shard_scores`), the rules (:mod:`.selection`)
and the job (:mod:`.job`)."""

from asymvlm.curation.curate_config import CurateConfig, SelectionRule, parse_rule
from asymvlm.curation.job import CurationSummary, curate, plan_job

__all__ = ["CurateConfig", "CurationSummary", "SelectionRule", "curate", "parse_rule", "plan_job"]
