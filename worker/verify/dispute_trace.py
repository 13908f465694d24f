"""Narrowing a disputed loop segment, Verde-style: the disputants and the tie-breaker re-run the segment with a
short digest of every op's output at every step (made only on these re-runs, so an honest run pays nothing), and
the first step whose digests differ, then the first op of that step, name where two workers part ways.

A trace is, per step, the template that ran (u16), its op count (u32) and 8 bytes per op (BLAKE2b of the output's
dtype, shape and bytes)."""
import hashlib
import struct
from typing import Any, Callable, Optional, Union

import torch

from ravop.runtime.loop_run import LoopRun
from ravop.wire import encode_tensor

from ..execute import device as devices

_STEP = struct.Struct("<HI")
OP_DIGEST = 8


def op_digest(value: Any) -> bytes:
    """8 bytes that change with any bit of an op's output (a tensor, or a tuple of them)."""
    h = hashlib.blake2b(digest_size=OP_DIGEST)
    for part in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(part, torch.Tensor):
            h.update(encode_tensor(devices.to_host(part).contiguous()))
        else:
            h.update(repr(part).encode())
    return h.digest()


def wrap_calls(loop_run: LoopRun, hook: Callable[[int, int, Any], Any]) -> None:
    """Have every op of every template of `loop_run` (a ravop.runtime.loop_run.LoopRun) hand its output to
    `hook(template, op index, value)`, which returns the value the step goes on with."""
    for t, step in enumerate(loop_run.steps):
        step.run_plain()   # the hooks wrap the op-by-op calls (the step compiler's give the same outputs)
        runner = step.runner
        for index, (kernel, args, params, out, frees, varies) in enumerate(runner.calls):
            if varies is None:
                def kernel_(*a: Any, _kernel: Callable[..., Any] = kernel, _t: int = t, _i: int = index,
                            **p: Any) -> Any:
                    return hook(_t, _i, _kernel(*a, **p))
                runner.calls[index] = (kernel_, args, params, out, frees, None)
            else:
                def varies_(kernel: Callable[..., Any], a: Any, p: Any, at: Any,
                            _varies: Callable[..., Any] = varies, _t: int = t, _i: int = index) -> Any:
                    return hook(_t, _i, _varies(kernel, a, p, at))
                # the runner's Call names a PerRun; any callable of its signature is called the same way
                runner.calls[index] = (kernel, args, params, out, frees, varies_)  # type: ignore[assignment]


class Tracer:
    """Records a trace while a segment re-runs: `instrument(loop_run)`, then `step()` after each step."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.template = 0
        self.ops: list[bytes] = []

    def instrument(self, loop_run: LoopRun) -> None:
        wrap_calls(loop_run, self._record)

    def _record(self, template: int, index: int, value: Any) -> Any:
        self.template = template
        self.ops.append(op_digest(value))
        return value

    def step(self) -> None:
        self.data += _STEP.pack(self.template, len(self.ops)) + b"".join(self.ops)
        self.ops = []

    def bytes(self) -> bytes:
        return bytes(self.data)


def unpack(data: bytes) -> list[tuple[int, list[bytes]]]:
    """[(template, [op digest, ...]) per step] of a trace."""
    steps: list[tuple[int, list[bytes]]] = []
    at = 0
    while at + _STEP.size <= len(data):
        template, n = _STEP.unpack_from(data, at)
        at += _STEP.size
        steps.append((template, [data[at + k * OP_DIGEST:at + (k + 1) * OP_DIGEST] for k in range(n)]))
        at += n * OP_DIGEST
    return steps


def first_difference(one: list[tuple[int, list[bytes]]], other: list[tuple[int, list[bytes]]]
                     ) -> Optional[Union[tuple[int, int, int], tuple[int, None, None]]]:
    """(step offset, template, op index) where two unpacked traces first differ; None if they agree."""
    for offset, ((t, ops), (u, others)) in enumerate(zip(one, other)):
        if t != u:
            return offset, t, 0
        for index, (a, b) in enumerate(zip(ops, others)):
            if a != b:
                return offset, t, index
        if len(ops) != len(others):
            return offset, t, min(len(ops), len(others))
    if len(one) != len(other):
        return min(len(one), len(other)), None, None
    return None
