"""Ray Tune wiring: the sweep, its trials and their MLflow runs."""
