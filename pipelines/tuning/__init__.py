"""Ray Tune wiring: the paper's sweep (:mod:`~pipelines.tuning.sweep`), its trials
(:mod:`~pipelines.tuning.trials`) and their MLflow runs (:mod:`~pipelines.tuning.trial_log`)."""
