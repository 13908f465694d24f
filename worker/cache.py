"""A byte-bounded LRU of tensors this worker produced, so a chain continuing here skips Redis."""
from collections import OrderedDict


class TensorCache:
    def __init__(self, max_bytes):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items = OrderedDict()

    def get(self, key):
        tensor = self._items.get(key)
        if tensor is not None:
            self._items.move_to_end(key)
        return tensor

    def put(self, key, tensor):
        size = tensor.numel() * tensor.element_size()
        if size > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.numel() * old.element_size()
        self._items[key] = tensor
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self.bytes -= evicted.numel() * evicted.element_size()
