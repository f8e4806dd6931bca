"""Embedding a data set with a frozen encoder, without Ray: the job (:mod:`.embed_config`), the
row-level work (:mod:`.encoding`) and the encoders (:mod:`.encoders`)."""
