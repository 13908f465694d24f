"""TorchScript-able torch equivalents of ops whose torch call takes its arguments differently, and the functions
that turn a recorded op's params into their keyword arguments. An op names its equivalent in its registry entry
(`register(..., torch_function=(function, kwargs))`); `ravdl.v2.export` emits a saved model's own forward code
as calls of them, so each must be a plain typed function that torch.jit.script accepts. A function's name is
what a saved model's program stores."""
from typing import List

import torch
from torch import Tensor


def transpose(x: Tensor, axes: List[int]) -> Tensor:
    return x.permute(axes)


def reshape(x: Tensor, shape: List[int]) -> Tensor:
    return x.reshape(shape)


def flatten(x: Tensor, start_dim: int, end_dim: int) -> Tensor:
    return torch.flatten(x, start_dim, end_dim)


def expand_dims(x: Tensor, axis: int) -> Tensor:
    return x.unsqueeze(axis)


def concat(xs: List[Tensor], axis: int) -> Tensor:
    return torch.cat(xs, axis)


def softmax(x: Tensor, axis: int) -> Tensor:
    return torch.softmax(x, axis)


def log_softmax(x: Tensor, axis: int) -> Tensor:
    return torch.log_softmax(x, axis)


def reduce_sum(x: Tensor, axis: List[int], keepdims: bool) -> Tensor:
    return torch.sum(x, axis, keepdims)


def reduce_mean(x: Tensor, axis: List[int], keepdims: bool) -> Tensor:
    return torch.mean(x, axis, keepdims)


def identity(x: Tensor) -> Tensor:
    return x


# ------------------------------------------------------------------------- params -> keyword arguments

def no_params(node):
    return {}


def same_params(node):
    return dict(node.params)


def reduction(node):
    axis = node.params["axis"]
    ndim = len(node.inputs[0].shape)
    axes = list(range(ndim)) if axis is None else [axis] if isinstance(axis, int) else list(axis)
    return {"axis": axes, "keepdims": node.params["keepdims"]}


def permutation(node):
    return {"axes": list(node.params["axes"] or range(len(node.inputs[0].shape) - 1, -1, -1))}


def shape_list(node):
    return {"shape": list(node.params["shape"])}
