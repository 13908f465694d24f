"""A pretend accelerator for CPU-only machines, to catch kernels that put a tensor on the wrong device.

Inside `pretend_device()`, tensors on `DEVICE` (torch's `meta` device) are `OnDevice` tensors: they report
device `meta` but hold real CPU data, so every kernel runs and computes true values, data-dependent ones
(`nonzero`, `unique`, `.item()`) included, which plain meta tensors cannot. Like a GPU, the pretend device
refuses to mix: an op given both an `OnDevice` tensor and a plain CPU tensor raises, as CUDA does ("Expected
all tensors to be on the same device"), and a factory (`torch.zeros`) makes a CPU tensor unless it is told
the device or runs under `torch.device(DEVICE)`. `.to(DEVICE)` and `.cpu()` are the only ways across.
"""
import contextlib

import torch
from torch.utils import _pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, return_and_correct_aliasing

DEVICE = torch.device("meta")
_aten = torch.ops.aten
_TRANSFERS = {_aten._to_copy.default, _aten.copy_.default}  # .to(device), .cpu(), x.copy_(y)


class MixedDevicesError(RuntimeError):
    pass


class OnDevice(torch.Tensor):
    """A tensor on the pretend device; `inner` is its CPU data."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                   storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                   device=DEVICE, requires_grad=inner.requires_grad)

    def __init__(self, inner):
        self.inner = inner

    def __repr__(self):
        return f"OnDevice({self.inner!r})"

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return OnDevice(inner_tensors["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _wrap(value):
    return OnDevice(value) if isinstance(value, torch.Tensor) and not isinstance(value, OnDevice) else value


def _run(func, args, kwargs):
    flat = pytree.tree_leaves((args, kwargs))
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    on_device = [t for t in tensors if isinstance(t, OnDevice)]
    wants_device = kwargs.get("device") is not None and torch.device(kwargs["device"]) == DEVICE
    if func in _TRANSFERS:
        if func is _aten._to_copy.default:
            source = args[0].inner if isinstance(args[0], OnDevice) else args[0]
            target = kwargs.get("device", args[0].device)
            out = func(source, **{**kwargs, "device": torch.device("cpu")})
            return OnDevice(out) if torch.device(target) == DEVICE else out
        destination, source = args[0], args[1]
        (destination.inner if isinstance(destination, OnDevice) else destination).copy_(
            source.inner if isinstance(source, OnDevice) else source, *args[2:], **kwargs)
        return destination
    plain = [t for t in tensors if not isinstance(t, OnDevice)]
    if plain and (on_device or wants_device):
        raise MixedDevicesError(f"{func}: expected all tensors to be on the same device, but found {DEVICE} and "
                                f"{', '.join(sorted({str(t.device) for t in plain}))}")
    if plain and any(t.device == DEVICE for t in plain):
        raise MixedDevicesError(f"{func}: a plain meta tensor (no data) reached a kernel")
    if not on_device and not wants_device:
        return func(*args, **kwargs)  # the host computing on the host
    unwrap = lambda t: t.inner if isinstance(t, OnDevice) else t  # noqa: E731
    inner_args, inner_kwargs = pytree.tree_map(unwrap, (args, kwargs))
    if wants_device:
        inner_kwargs["device"] = torch.device("cpu")
    out = pytree.tree_map(_wrap, func(*inner_args, **inner_kwargs))
    # An in-place op returns its (wrapped) argument, a view shares its base's storage, as on a real device.
    return return_and_correct_aliasing(func, args, kwargs, out) if on_device else out


class _Mode(TorchDispatchMode):
    """Sees every op, factories (no tensor inputs) and moves of host tensors to the device included."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


class _FromData(TorchFunctionMode):
    """torch.tensor(data, device=...) fills its tensor outside the dispatcher: made on the host and moved."""
    FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.scalar_tensor}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FROM_DATA:
            target = kwargs.get("device") or torch.get_default_device()
            if torch.device(target) == DEVICE:
                return func(*args, **{**kwargs, "device": "cpu"}).to(DEVICE)
        return func(*args, **kwargs)


@contextlib.contextmanager
def pretend_device():
    with _Mode(), _FromData():
        yield DEVICE


def on_device(value):
    """True if `value` (a tensor) is on the pretend device."""
    return isinstance(value, OnDevice)
