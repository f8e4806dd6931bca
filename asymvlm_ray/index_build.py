"""An index built on Ray Data (docs/search.md): the tables' parts read and encoded by an actor
pool (a GPU each where there are some), the encodings streamed back in table order to the
driver, which adds them to FAISS (:func:`asymvlm.indexing.build_index` with
:func:`encoded_on_ray`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from asymvlm.indexing.build import (
    COLUMNS,
    EncodedBatches,
    encode_caption_batch,
    encode_image_batch,
)
from asymvlm.methods import Method
from asymvlm.storage import filesystem, join, ray_storage
from asymvlm.tables import IMAGES_DIR, list_parquet
from asymvlm_ray.session import require_ray

#: Rows an actor encodes at a time.
BATCH_ROWS = 16384
#: Prefix of the encoding's columns in the blocks the actors return.
ENCODED = "encoded."


class _EncodeRows:
    """A Ray Data actor: the adapter, loaded where it is given (a folder every node sees, an
    object-store, MLflow or Hub URI) on its device, encoding batches of one kind of row into
    the same rows plus one column per encoding (``encoded.mu`` ...)."""

    def __init__(self, adapter: str, adapter_input: str, kind: str) -> None:
        from asymvlm.api import load_checkpoint

        self.method, _ = load_checkpoint(adapter, "cuda" if torch.cuda.is_available() else "cpu")
        self.method.adapter_input = adapter_input
        self.encode = encode_image_batch if kind == IMAGES_DIR else encode_caption_batch

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_batches()[0] if batch.num_rows else pa.RecordBatch.from_pylist([])
        encoding = self.encode(self.method, rows, 0)
        out = batch.drop_columns([c for c in ("embedding", "norm") if c in batch.column_names])
        for name, value in encoding.items():
            array = value.float().cpu().numpy()
            if array.ndim == 2:
                column = pa.FixedSizeListArray.from_arrays(
                    pa.array(array.reshape(-1)), array.shape[1]
                )
            else:
                column = pa.array(array)
            out = out.append_column(ENCODED + name, column)
        return out


def encoded_on_ray(
    tables: str, split: str, kind: str, method: Method, adapter: str
) -> EncodedBatches:
    """The batches of ``ROOT/split/kind`` encoded by a Ray Data actor pool, in table order
    (the running Ray session's; :func:`asymvlm.indexing.build.encoded_here`'s contract)."""
    import ray

    require_ray("the index build on Ray Data")
    fs, base = filesystem(tables)
    paths = list_parquet(fs, join(base, split, kind))
    present = pq.ParquetFile(paths[0], filesystem=fs).schema_arrow.names
    _, ray_fs = ray_storage(tables)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # the rows' order is the index's ids
    dataset = ray.data.read_parquet(
        paths, filesystem=ray_fs, columns=[c for c in COLUMNS[kind] if c in present]
    )
    encoded = dataset.map_batches(
        _EncodeRows,
        fn_constructor_args=(adapter, method.adapter_input, kind),
        batch_size=BATCH_ROWS,
        batch_format="pyarrow",
        concurrency=(1, 4),
        # Not restarted by Ray (as the embedding stage's pool): Ray core prints an ERROR for
        # each restartable actor given object-store arguments (ray-project/ray#57733); a lost
        # actor ends the build, which writes nothing until it is whole.
        max_restarts=0,
        num_gpus=1 if torch.cuda.is_available() else 0,
    )
    for block in encoded.iter_batches(batch_size=BATCH_ROWS, batch_format="pyarrow"):
        yield _split_block(block)


def _split_block(block: pa.Table) -> tuple[pa.RecordBatch, dict[str, torch.Tensor]]:
    """(the rows, their encoding as tensors) of a block an actor returned."""
    encoding: dict[str, Any] = {}
    for name in [c for c in block.column_names if c.startswith(ENCODED)]:
        column = block.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            values = column.flatten().to_numpy().reshape(len(column), column.type.list_size)
        else:
            values = column.to_numpy()
        encoding[name.removeprefix(ENCODED)] = torch.from_numpy(np.array(values, np.float32))
    rows = block.drop_columns([c for c in block.column_names if c.startswith(ENCODED)])
    return rows.combine_chunks().to_batches()[0], encoding
