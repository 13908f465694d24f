"""What `R.fetch_persisting_op` returns for a tensor: a torch.Tensor that also answers `['result']`.

The original returned RavDL layer outputs as `{'result': tensor}` and raw ops' values as bare tensors, so
scripts do either `fetch(...)['result']` or use the tensor directly; this one value serves both. Anything
computed from it is a plain torch.Tensor again."""
import torch


class FetchedTensor(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl   # ops on it give plain tensors

    def __getitem__(self, key):
        if isinstance(key, str):
            if key == "result":
                return self.as_subclass(torch.Tensor)
            raise KeyError(f"a fetched value answers only ['result'] (the original's dict form), not {key!r}")
        return super().__getitem__(key)

    def __repr__(self, **kwargs):
        return repr(self.as_subclass(torch.Tensor))


def fetched(tensor):
    return tensor.as_subclass(FetchedTensor)
