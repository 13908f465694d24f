"""What `fit` trains on: numpy arrays and torch tensors as they are, a .npy file's path mapped (as
`np.load(path, mmap_mode="c")`: the pages stay the file's, no copy in this process's memory), and a map-style
torch Dataset or a DataLoader over one, read once into two tensors (with a progress bar) that go up with the graph
like arrays do. The training loop slices its batches on the worker, so a DataLoader's own batching, workers and
collate function do not run: its batch size and whether it shuffles are taken, the rest refused when it would
change the data."""
import mmap
import os
from typing import Any, Optional

import numpy as np
import torch

# Fraction of the memory available that a dataset read into tensors may take: it is held once more while it is
# serialized for the upload.
MEMORY_SHARE = 0.5


def training_data(X: Any, y: Any, batch_size: Optional[int], shuffle: bool) -> tuple[Any, Any, int, bool]:
    """(X, y, batch_size, shuffle) for fit: arrays and tensors pass through; a DataLoader or a map-style Dataset
    (whose items are (x, y) pairs) is read into two stacked tensors, and a DataLoader gives the batch size (unless
    fit was given one) and the shuffling."""
    X, y = mapped(X, "X"), mapped(y, "y")
    try:
        from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler
    except ImportError:  # torch without its data utilities: only arrays can be given then
        return X, y, batch_size, shuffle  # type: ignore[return-value]   # a None batch_size is not refused here
    if isinstance(X, DataLoader):
        loader = X
        if y is not None:
            raise ValueError("fit(DataLoader) takes no y: the loader's items are (x, y) pairs")
        if isinstance(loader.dataset, IterableDataset):
            raise TypeError("fit reads a map-style Dataset (len and indexing), not an IterableDataset: the whole "
                            "dataset goes up once and the worker slices the batches")
        if loader.batch_size is None:
            raise ValueError("fit(DataLoader) needs a loader with a batch_size (not batch_size=None or a "
                             "batch_sampler)")
        if loader.drop_last:
            raise NotImplementedError("fit(DataLoader(drop_last=True)) is not implemented: fit trains on every row "
                                      "(the last batch may be short)")
        if type(loader.sampler) not in (SequentialSampler, RandomSampler):
            raise NotImplementedError(f"fit(DataLoader) takes the sequential or the random sampler, not "
                                      f"{type(loader.sampler).__name__}: give fit the arrays")
        if batch_size is not None and int(batch_size) != loader.batch_size:
            raise ValueError(f"fit(batch_size={batch_size}) differs from the DataLoader's batch_size "
                             f"{loader.batch_size}: leave one out")
        X, y = _read(loader.dataset)
        # The engine draws its own permutation from fit's seed: the order differs from torch's generator's.
        return X, y, loader.batch_size, shuffle or isinstance(loader.sampler, RandomSampler)
    if isinstance(X, IterableDataset):
        raise TypeError("fit reads a map-style Dataset (len and indexing), not an IterableDataset")
    if isinstance(X, Dataset):
        if y is not None:
            raise ValueError("fit(Dataset) takes no y: the dataset's items are (x, y) pairs")
        X, y = _read(X)
    elif y is None:
        raise ValueError("fit needs y (targets) with arrays or tensors, or a Dataset or DataLoader of (x, y) pairs")
    if batch_size is None:
        raise ValueError("fit needs batch_size (only a DataLoader brings its own)")
    return X, y, batch_size, shuffle


def mapped(value: Any, name: str) -> Any:
    """`value`, a .npy path mapped copy-on-write, or a read-only numpy memmap of a whole file (np.load's
    mmap_mode="r") mapped again copy-on-write: R.t uses a writable array as it is but copies a read-only one, and a
    copy-on-write mapping is writable without a page copied until something writes it (nothing does)."""
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"fit: {name} names no file: {path!r} (give an array, or a .npy file's path)")
        try:
            return np.load(path, mmap_mode="c", allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"fit: {name} ({path!r}) is not a .npy file of numbers: {exc}") from None
    if isinstance(value, np.memmap) and isinstance(value.base, mmap.mmap) and not value.flags.writeable \
            and value.filename is not None:
        return np.memmap(value.filename, value.dtype, "c", value.offset, value.shape,
                         "F" if value.flags.f_contiguous and not value.flags.c_contiguous else "C")
    return value


def _read(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors stacking the dataset's (x, y) items, read in order with a progress bar; refused before
    reading it all when it will not fit in memory."""
    from tqdm.auto import tqdm
    try:
        n = len(dataset)
    except TypeError:
        raise TypeError(f"fit reads a map-style Dataset, which has a len(); {type(dataset).__name__} has none") \
            from None
    if n == 0:
        raise ValueError("the Dataset is empty")
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    with tqdm(total=n, desc="reading the dataset", unit="item", delay=1.0) as bar:
        for i in range(n):
            x, y = _pair(dataset[i], i)
            if i == 0:
                _check_fits(n, x, y)
            xs.append(x)
            ys.append(y)
            bar.update()
    return torch.stack(xs), torch.stack(ys)


def _pair(item: Any, index: int) -> tuple[torch.Tensor, ...]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise TypeError(f"item {index} of the Dataset is a {type(item).__name__}"
                        f"{' of ' + str(len(item)) if isinstance(item, (tuple, list)) else ''}: fit takes items "
                        "that are (x, y) pairs")
    return tuple(value.detach().cpu() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
                 for value in item)


def _check_fits(n: int, x: torch.Tensor, y: torch.Tensor) -> None:
    need = n * (x.nelement() * x.element_size() + y.nelement() * y.element_size())
    available = available_memory()
    if available is not None and need > MEMORY_SHARE * available:
        raise MemoryError(f"the Dataset's {n:,} items take about {need / 2**30:.2f} GiB as tensors, more than "
                          f"{MEMORY_SHARE:.0%} of the {available / 2**30:.2f} GiB of memory available here: fit "
                          "uploads the whole dataset once, so it must fit in memory (train on a part of it, or in "
                          "several fits over parts)")


def available_memory() -> Optional[int]:
    """Bytes of memory available to new allocations (Linux's MemAvailable; None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
