"""A provider's data (`ravop-worker --data PATH ...`): the numeric columns of its CSV and Parquet files, read
once at start. It stays in this process: only the partial statistics of `worker.provider.data_provider` are ever written
to Redis.

A CSV file has a header row; a column is numeric if every non-empty cell parses as a number. A Parquet file
(`.parquet`, read with pyarrow: `pip install 'ravop-engine[parquet]'`) offers its integer and floating-point
columns. Other columns are not offered. Empty cells, nulls and NaN are missing values, which no statistic
counts. A column found in several files holds the values of all of them.
"""
import csv
import math
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import numpy as np

PARQUET_SUFFIXES = (".parquet", ".pq")


class DataError(ValueError):
    """A data file that cannot be read as a table of columns (the message names the file, never its values)."""


class ProviderData:
    def __init__(self, columns: dict[str, Any]) -> None:
        self.columns = columns      # name -> float64 array, NaN where a value is missing

    @classmethod
    def load(cls, paths: Iterable[Union[str, Path]]) -> "ProviderData":
        parts: dict[str, list[Any]] = {}
        for given in paths:
            path = Path(given)
            read = _read_parquet if path.suffix.lower() in PARQUET_SUFFIXES else _read_csv
            for name, values in read(path).items():
                parts.setdefault(name, []).append(values)
        return cls({name: np.concatenate(arrays) for name, arrays in parts.items()})

    def names(self) -> list[str]:
        return sorted(self.columns)


def _read_csv(path: Path) -> dict[str, Any]:
    """{column: float64 array} of the numeric columns of one CSV file."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows = csv.reader(f)
            header = next(rows, None)
            if not header or not any(name.strip() for name in header):
                raise DataError(f"{path}: no header row naming the columns")
            names = _unique([name.strip() for name in header], path)
            cells: list[list[str]] = [[] for _ in names]
            for line, row in enumerate(rows, start=2):
                if not row:
                    continue
                if len(row) != len(names):
                    raise DataError(f"{path}:{line}: {len(row)} fields, but the header names {len(names)} columns")
                for column, cell in zip(cells, row):
                    column.append(cell)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot be read as CSV: {type(exc).__name__}") from None
    numeric: dict[str, Any] = {}
    for name, column in zip(names, cells):
        values = _numbers(column)
        if values is not None and name:
            numeric[name] = values
    return numeric


def _read_parquet(path: Path) -> dict[str, Any]:
    """{column: float64 array} of the integer and floating-point columns of one Parquet file."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install 'ravop-engine[parquet]'") from None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{path}: cannot be read as Parquet: {type(exc).__name__}") from None
    names = _unique(table.column_names, path)
    return {name: column.cast(pa.float64()).to_numpy(zero_copy_only=False)  # nulls become NaN
            for name, column in zip(names, table.columns)
            if pa.types.is_integer(column.type) or pa.types.is_floating(column.type)}


def _unique(names: list[str], path: Path) -> list[str]:
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise DataError(f"{path}: column(s) {', '.join(duplicated)} appear more than once")
    return names


def _numbers(cells: list[str]) -> Optional[Any]:
    """The cells as a float64 array (empty -> NaN), or None if one of them is not a number."""
    values: Any = np.empty(len(cells), dtype=np.float64)
    for i, cell in enumerate(cells):
        cell = cell.strip()
        if not cell:
            values[i] = math.nan
            continue
        try:
            values[i] = float(cell)
        except ValueError:
            return None
    return values
