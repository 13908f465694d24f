"""Helpers for sample references written with numpy (an implementation independent of torch's kernels)."""
import numpy as np
import torch

rng = np.random.default_rng(20240601)


def normal(*shape):
    """float64 standard-normal samples (distinct values, so no ties at non-differentiable points)."""
    return rng.standard_normal(shape)


def f32(*shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


def ints(low, high, *shape):
    return rng.integers(low, high, size=shape)


def numpy(fn):
    """A reference that runs `fn` on the inputs as numpy arrays (params passed through)."""
    def reference(*tensors, **params):
        out = fn(*(t.numpy() for t in tensors), **params)
        if isinstance(out, tuple):
            return tuple(torch.as_tensor(np.array(o)) for o in out)
        return torch.as_tensor(np.array(out))  # a copy: torch refuses negative strides (np.flip)
    return reference
