"""The Ray layer of asymvlm: the science of :mod:`asymvlm` wired onto Ray Data, Train, Tune and
Serve. The scripts that start Ray (``pipelines/*.py``) import it; nothing here starts Ray on
import (docs/pipeline.md)."""
