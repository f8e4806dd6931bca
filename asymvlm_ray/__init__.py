"""The Ray layer of asymvlm: the science of :mod:`asymvlm` wired onto Ray Data, Train, Tune and
Serve; nothing here starts Ray on import, the ``pipelines/*.py`` scripts do (docs/pipeline.md)."""
