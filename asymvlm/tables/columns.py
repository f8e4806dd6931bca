"""Column helpers of the reader (:mod:`asymvlm.tables.read`): validated string columns, a
read-only sequence over Arrow strings, and ``list<float>`` columns copied batch by batch into one
preallocated float32 matrix, with the reader's checks run block by block (no full-size
temporaries)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from asymvlm.tables.files import TableError

#: Rows per block when checking a matrix (NaN/inf, unit norm): a bounded temporary per block.
CHECK_ROWS = 1 << 15


def row_error(shown: str, row: int, id_name: str, ids: Any, msg: str) -> TableError:
    ident = ids[row].as_py() if ids is not None and row < len(ids) else None
    return TableError(f"{shown} row {row} ({id_name} {ident!r}): {msg}")


def first_true(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


# --------------------------------------------------------------------------------------------
# strings


def string_column(table: pa.Table, name: str, shown: str, id_name: str, ids: Any) -> pa.Array:
    """Column ``name`` as one ``string`` array, refused (naming file, row and id) when it is not
    a string column, holds invalid UTF-8 or a null."""
    col = table.column(name)
    typ = col.type
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        raise TableError(f"{shown}: column {name!r} has type {col.type}, expected string")
    arr = col.cast(pa.string()).combine_chunks() if len(col) else pa.array([], pa.string())
    check_utf8(arr, name, shown, id_name, ids)
    if arr.null_count:
        row = first_true(np.asarray(arr.is_null().to_numpy(zero_copy_only=False)))
        ref = ids if ids is not None else arr
        raise row_error(shown, row, id_name, ref, f"{name} is null")
    return arr


def check_utf8(arr: pa.Array, name: str, shown: str, id_name: str, ids: Any) -> None:
    """:class:`TableError` naming file, row and column if a string column holds invalid UTF-8
    (parquet does not check it on write; Python would fail later on that row)."""
    try:
        arr.validate(full=True)
        return
    except pa.ArrowInvalid:
        pass
    raw = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary())
    for row, value in enumerate(raw.to_pylist()):
        if value is None:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as exc:
            what = (
                f"column {name!r} is not valid UTF-8 ({exc.reason} at byte {exc.start}: "
                f"{value[max(0, exc.start - 16) : exc.start + 4]!r})"
            )
            if ids is None:  # the id column itself: its value cannot be shown
                raise TableError(f"{shown} row {row}: {what}") from None
            raise row_error(shown, row, id_name, ids, what) from None
    raise TableError(f"{shown}: column {name!r} is not a valid string column")


class StringColumn(Sequence[str]):
    """The strings of an Arrow string column as a read-only sequence of ``str``, without a
    Python object per row until one is asked for.

    ``col[i]`` is one string, a slice is a ``list``; iteration converts a block at a time;
    equality holds with any sequence of the same strings (``col == ["a", "b"]``).
    :meth:`to_arrow` gives the column itself.
    """

    _BLOCK = 1 << 14

    def __init__(self, values: pa.Array | pa.ChunkedArray | Sequence[str]) -> None:
        if isinstance(values, pa.Array):
            values = pa.chunked_array([values], type=values.type)
        elif not isinstance(values, pa.ChunkedArray):
            values = pa.chunked_array([pa.array(list(values), pa.string())], type=pa.string())
        self._values: pa.ChunkedArray = values

    def to_arrow(self) -> pa.ChunkedArray:
        """The strings as an Arrow chunked array (no copy)."""
        return self._values

    def take(self, rows: np.ndarray) -> StringColumn:
        """The strings at ``rows`` (0-based positions), as a new column."""
        return StringColumn(self._values.take(pa.array(np.asarray(rows, dtype=np.int64))))

    def __len__(self) -> int:
        return len(self._values)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        n = len(self._values)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                return self._values.slice(start, max(0, stop - start)).to_pylist()
            return [self[k] for k in range(start, stop, step)]
        index = int(index)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"string index {index} out of range for {n} strings")
        return self._values[index].as_py()

    def __iter__(self) -> Iterator[str]:
        for chunk in self._values.chunks:
            for start in range(0, len(chunk), self._BLOCK):
                yield from chunk.slice(start, self._BLOCK).to_pylist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringColumn):
            return len(self) == len(other) and bool(self._values.equals(other._values))
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-sequence semantics: unhashable

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        more = ", ..." if len(self) > 3 else ""
        return f"StringColumn([{head}{more}], {len(self)} strings)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (StringColumn, (self._values,))


# --------------------------------------------------------------------------------------------
# list<float> columns into a preallocated matrix


def check_list_type(typ: pa.DataType, name: str, shown: str) -> None:
    """:class:`TableError` unless ``typ`` is a (large / fixed-size) list of numbers."""
    if not (
        pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
    ):
        raise TableError(f"{shown}: column {name!r} has type {typ}, expected list<float32>")
    if not (pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type)):
        raise TableError(f"{shown}: column {name!r} has type {typ}, expected list<float32>")


def is_list_of_numbers(typ: pa.DataType) -> bool:
    """Whether :func:`check_list_type` accepts ``typ``."""
    try:
        check_list_type(typ, "", "")
    except TableError:
        return False
    return True


@dataclass
class FillReport:
    """The structural problems of one file's list column, first row of each kind (rows are
    0-based in the file); :meth:`error` names the one the reader reports."""

    null_row: int | None = None
    bad_length: tuple[int, int] | None = None  # (row, its length)
    null_value_row: int | None = None

    @property
    def clean(self) -> bool:
        return self.null_row is None and self.bad_length is None and self.null_value_row is None

    def error(
        self, shown: str, id_name: str, ids: Any, name: str, width: int, width_of: str
    ) -> TableError | None:
        """The reported problem: a null row, else a row of another length, else null values
        (the order in which the reader checks a column)."""
        if self.null_row is not None:
            return row_error(shown, self.null_row, id_name, ids, f"{name} is null")
        if self.bad_length is not None:
            row, length = self.bad_length
            return row_error(
                shown, row, id_name, ids, f"{name} has length {length}, {width_of} is {width}"
            )
        if self.null_value_row is not None:
            return row_error(shown, self.null_value_row, id_name, ids, f"{name} has null values")
        return None


def fill_matrix(chunks: Iterable[tuple[pa.Array, bool]], out: np.ndarray, width: int) -> FillReport:
    """Copy the rows of a list column into ``out`` ([rows, width] float32, rows in file order)
    -- the one copy: each piece's values buffer is viewed by numpy without a copy where Arrow
    allows (float32 without nulls) and cast on assignment otherwise.

    ``chunks`` yields consecutive pieces of the column, each with whether it ends a *unit* (the
    reader's units are the chunks ``pq.read_table`` gives). Within a unit the problems of
    :class:`FillReport` rank as a whole-unit check finds them (a null row, then a row of
    another length, then null values); the first unit with one ends the scan. Once a problem is
    seen nothing more is copied (the file is refused).
    """
    report = FillReport()
    start = 0
    for chunk, unit_ends in chunks:
        n = len(chunk)
        if n:
            if chunk.null_count:
                report.null_row = start + first_true(chunk.is_null().to_numpy(zero_copy_only=False))
                return report  # the unit's first null row: nothing outranks it
            if report.bad_length is None:
                lengths = pc.list_value_length(chunk).to_numpy(zero_copy_only=False)
                bad = first_true(lengths != width)
                if bad is not None:
                    report.bad_length = (start + bad, int(lengths[bad]))
            if report.clean:
                values = chunk.flatten()
                if values.null_count:
                    flat_null = values.is_null().to_numpy(zero_copy_only=False)
                    report.null_value_row = start + first_true(flat_null) // width
                else:
                    flat = values.to_numpy(zero_copy_only=False)
                    out[start : start + n] = flat.reshape(n, width)
            start += n
        if unit_ends and not report.clean:
            return report
    return report


def first_nonfinite(matrix: np.ndarray) -> int | None:
    """First row of ``matrix`` holding a NaN/inf, checked block by block."""
    for lo in range(0, len(matrix), CHECK_ROWS):
        bad = first_true(~np.isfinite(matrix[lo : lo + CHECK_ROWS]).all(axis=1))
        if bad is not None:
            return lo + bad
    return None


def check_unit(emb: np.ndarray, norm_atol: float, shown: str, id_name: str, ids: Any) -> None:
    """:class:`TableError` naming the first row with NaN/inf, else the first row whose norm is
    not 1 within ``norm_atol``; norms in float64, block by block."""
    bad = first_nonfinite(emb)
    if bad is not None:
        raise row_error(shown, bad, id_name, ids, "embedding has NaN/inf")
    for lo in range(0, len(emb), CHECK_ROWS):
        block = emb[lo : lo + CHECK_ROWS]
        norms = np.sqrt(np.einsum("ij,ij->i", block, block, dtype=np.float64))
        bad = first_true(np.abs(norms - 1.0) > norm_atol)
        if bad is not None:
            raise row_error(
                shown,
                lo + bad,
                id_name,
                ids,
                f"embedding norm is {norms[bad]:.6g}, expected 1 within {norm_atol:g}",
            )


class RowBuffer:
    """A preallocated ``[capacity, width]`` float32 matrix filled file by file; grows (one
    copy) only if the files hold more rows than their footers said."""

    def __init__(self, capacity: int, width: int) -> None:
        self.data = np.empty((capacity, width), dtype=np.float32)
        self.width = width

    def rows(self, start: int, n: int) -> np.ndarray:
        """The view of rows ``start .. start + n`` (growing the buffer when needed)."""
        if start + n > len(self.data):
            grown = np.empty((max(start + n, 2 * len(self.data)), self.width), np.float32)
            grown[:start] = self.data[:start]
            self.data = grown
        return self.data[start : start + n]

    def result(self, used: int) -> np.ndarray:
        """The first ``used`` rows (the buffer itself when it is full)."""
        return self.data if used == len(self.data) else self.data[:used]
