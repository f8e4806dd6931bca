"""Ray Tune wiring: the paper's sweep (:mod:`~pipelines.tuning.sweep`), its trials
(:mod:`~pipelines.tuning.trials`), both stages as one search
(:mod:`~pipelines.tuning.search`) and the trials' MLflow runs
(:mod:`~pipelines.tuning.trial_log`)."""
