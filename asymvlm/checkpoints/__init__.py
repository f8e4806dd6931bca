"""Checkpoint folders: the one owner of their layout, for every writer and reader.

* :mod:`~asymvlm.checkpoints.folder` -- the files (``config.json``, ``model.pt``,
  ``history.jsonl``, ``trainer.pt``; a pack's state and member folders), written as a whole
  (:func:`publish_folder`) and read back (:func:`load_checkpoint`, :func:`read_run_state`);
* :mod:`~asymvlm.checkpoints.resume` -- whether an output folder may be written or continued;
* :mod:`~asymvlm.checkpoints.sources` -- a folder or an MLflow model URI to a local folder.
"""

from asymvlm.checkpoints.folder import (
    ADAPTER_FILES,
    CHECKPOINT_FILES,
    CONFIG_FILE,
    HISTORY_FILE,
    MEMBER_FOLDER,
    PACK_STATE_FILE,
    TRAINER_FILE,
    WEIGHTS_FILE,
    RunState,
    copy_adapter,
    discard_checkpoint,
    load_checkpoint,
    member_folder,
    provenance,
    publish_folder,
    read_checkpoint_meta,
    read_history,
    read_pack_state,
    read_run_state,
    recover_checkpoint,
    save_checkpoint,
    save_pack_checkpoint,
    save_run_checkpoint,
)
from asymvlm.checkpoints.resume import (
    RESUME_MAY_DIFFER,
    check_output,
    check_resumable,
    checkpoint_to_resume,
)
from asymvlm.checkpoints.sources import is_model_uri, resolve_checkpoint

__all__ = [
    "ADAPTER_FILES",
    "CHECKPOINT_FILES",
    "CONFIG_FILE",
    "HISTORY_FILE",
    "MEMBER_FOLDER",
    "PACK_STATE_FILE",
    "RESUME_MAY_DIFFER",
    "TRAINER_FILE",
    "WEIGHTS_FILE",
    "RunState",
    "check_output",
    "check_resumable",
    "checkpoint_to_resume",
    "copy_adapter",
    "discard_checkpoint",
    "is_model_uri",
    "load_checkpoint",
    "member_folder",
    "provenance",
    "publish_folder",
    "read_checkpoint_meta",
    "read_history",
    "read_pack_state",
    "read_run_state",
    "recover_checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
    "save_pack_checkpoint",
    "save_run_checkpoint",
]
