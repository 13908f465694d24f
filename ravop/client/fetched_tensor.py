"""What `R.fetch_persisting_op` returns for a tensor: a torch.Tensor that also answers `['result']`.

The original returned RavDL layer outputs as `{'result': tensor}` and raw ops' values as bare tensors, so
scripts do either `fetch(...)['result']` or use the tensor directly; this one value serves both. Anything
computed from it is a plain torch.Tensor again."""
import numpy as np
import torch


class FetchedTensor(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl   # ops on it give plain tensors

    def __getitem__(self, key):
        if isinstance(key, str):
            if key == "result":
                return self.as_subclass(torch.Tensor)
            raise KeyError(f"a fetched value answers only ['result'] (the original's dict form), not {key!r}")
        return super().__getitem__(key)

    def __array__(self, dtype=None, copy=None):
        """numpy 2's protocol (np.asarray(value), np.array(value, dtype, copy=...)): the tensor's own memory
        when it can be (copy=None or False), else a copy; copy=False where a copy is needed raises."""
        tensor = self.as_subclass(torch.Tensor).detach()
        needs_copy = tensor.device.type != "cpu" or tensor.dtype == torch.bfloat16 or \
            (dtype is not None and np.dtype(dtype) != _numpy_dtype(tensor.dtype))
        if copy is False and needs_copy:
            raise ValueError(f"a fetched {tensor.dtype} tensor on {tensor.device} cannot become a numpy array of "
                             f"{np.dtype(dtype) if dtype is not None else 'its dtype'} without a copy")
        array = (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).cpu().numpy()
        if dtype is not None:
            array = array.astype(dtype, copy=False)
        return array.copy() if copy and not needs_copy else array

    def __repr__(self, **kwargs):
        return repr(self.as_subclass(torch.Tensor))


def fetched(tensor):
    return tensor.as_subclass(FetchedTensor)


def _numpy_dtype(dtype):
    return torch.empty(0, dtype=dtype).numpy().dtype
