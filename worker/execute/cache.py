"""A byte-bounded LRU of tensors this worker produced or fetched, keyed by their Redis key: values are
immutable (one key, one value), so a chain continuing on this worker, or a constant every training step
reads, skips Redis."""
from collections import OrderedDict
from typing import Any, Optional


class TensorCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[Any, Any] = OrderedDict()   # key -> tensor

    def get(self, key: Any) -> Optional[Any]:
        tensor = self._items.get(key)
        if tensor is not None:
            self._items.move_to_end(key)
        return tensor

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def put(self, key: Any, tensor: Any) -> None:
        size = tensor.nbytes
        if size > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        self._items[key] = tensor
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self.bytes -= evicted.nbytes
