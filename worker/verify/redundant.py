"""Redundant execution (`R.Graph(verify=k)`): each subgraph runs on k distinct workers, which vote with a
digest of their outputs; the engine is deterministic (same graph, seed, torch version and thread count give the
same bits), so honest workers agree bit for bit. A disagreement fails the graph naming the workers, and a
worker outvoted by a majority is banned from that requester's work by its requester, on the votes'
evidence (ravop.client.bans; ravop.core.spot_policy.tally)."""
import hashlib
import logging
from typing import Any, Mapping

import torch

from ravop.runtime.loop_run import LoopRun
from ravop.wire import encode_tensor

from ..execute import device as devices
from .dispute_trace import wrap_calls

log = logging.getLogger("ravop.worker")


def digest(outputs: Mapping[int, Any]) -> str:
    """A hex digest of {output id: tensor}: dtype, shape and bytes of each, in id order."""
    h = hashlib.sha256()
    for node_id in sorted(outputs):
        h.update(node_id.to_bytes(8, "little"))
        h.update(encode_tensor(devices.to_host(outputs[node_id]).contiguous()))
    return h.hexdigest()


class Liar:
    """A test worker's dishonesty (`ravop-worker --test-wrong-outputs[=after:N]`): it returns `honest` results
    as computed, then lies on every result (a subgraph's outputs, a loop segment's carried values) from then on,
    re-runs included, as a worker with a faulty kernel or a cheater that earned trust first would."""

    def __init__(self, honest: int = 0) -> None:
        if type(honest) is not int or honest < 0:
            raise ValueError(f"a test liar's honest results must be an int >= 0, not {honest!r}")
        self.honest, self.results = honest, 0

    @classmethod
    def parse(cls, text: str) -> "Liar":
        """'always' or 'after:N'."""
        if text == "always":
            return cls(0)
        kind, _, count = text.partition(":")
        if kind != "after" or not count.isdigit():
            raise ValueError(f"--test-wrong-outputs takes 'always' or 'after:N', not {text!r}")
        return cls(int(count))

    def lies(self) -> bool:
        """Whether the result being made now is a lie; counts it."""
        self.results += 1
        return self.results > self.honest

    @property
    def lying(self) -> bool:
        """Whether the next result will be a lie (a loop segment's steps are perturbed while it is made)."""
        return self.results >= self.honest

    def instrument(self, loop_run: LoopRun) -> None:
        """Perturb, while `lying`, the first floating-point output of every step of `loop_run` (a
        ravop.runtime.loop_run.LoopRun): a faulty kernel. Logs which op it perturbs, once."""
        told: set[tuple[int, int]] = set()
        done = False   # whether this step's output was perturbed already

        def hook(template: int, index: int, value: Any) -> Any:
            nonlocal done
            if index == 0:
                done = False
            if not self.lying or done or not isinstance(value, torch.Tensor) or not value.is_floating_point() \
                    or not value.numel():
                return value
            done = True
            node = loop_run.steps[template].runner.nodes[index]
            if (template, index) not in told:
                told.add((template, index))
                log.warning("test liar: perturbing op %r recorded at %s", node.op, node.source)
            return perturb({0: value})[0]
        wrap_calls(loop_run, hook)


def perturb(outputs: Mapping[int, Any]) -> dict[int, Any]:
    """Outputs with one element changed: what `ravop-worker --test-wrong-outputs` returns, to test
    verification with a worker that computes wrong results."""
    changed = dict(outputs)
    node_id = min(changed)
    tensor = changed[node_id].contiguous().clone()
    if tensor.numel():
        flat = tensor.view(-1)
        flat[0] = ~flat[0] if tensor.dtype == torch.bool else flat[0] + 1
    changed[node_id] = tensor
    return changed
