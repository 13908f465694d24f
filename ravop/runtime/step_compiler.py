"""Make a loop's step template cheaper per run, bit for bit: a step compiler over a built `Runner`.

A step template runs hundreds of times with the same ops on the same shapes, so work that eager PyTorch (and
the plain runner) repeats every step can be done once, and per-op Python work can be merged. Every rewrite here
computes the same bits as the op it replaces, so the plain and the compiled step are interchangeable at any run:
a loop may switch between them, a worker that compiles and one that does not give the same numbers, and a
retry resumes from a checkpoint either way. Rewrites that change the bits (Inductor's fusions, which reorder
float arithmetic) are not made: whether they are used would depend on which worker measured what, and the same
graph and seed must give the same numbers on any worker.

The rewrites (each keeps the call list's length and order, and each op's output: the memory watcher, op
tracing and error messages see the same ops; those whose bits were checked on CPU kernels only are made on a
CPU only):
- (CPU) optimizer steps with the same settings (`adam_step` and `adamw_step` updating in place, where the loop
  owns their values; `rmsprop_step`) become one update of all their tensors, run at the first of them; the
  others hand out their part. Adam's is the op's own update (`fused=True`: torch's fused kernel, one call with
  every tensor; else torch's single-tensor loop) over every tensor: each tensor is updated on its own either way;
  RMSprop's is `torch._foreach_*`,
  whose kernels loop over the tensors in C++ with the same per-tensor kernels as the op's.
- a dropout's backward reuses the mask its forward drew in this run instead of drawing it again from the same
  seed (autodiff records the redraw so that no mask is stored between workers; inside one step it is kept).
- (CPU) a batch norm's backward reuses the batch statistics (mean, inverse std) its forward computed in this run
  instead of computing them again from the same input (ATen computes them with the same kernel either way).
- (CPU) a cross-entropy loss's backward (class-index targets) reuses the log-probabilities and the total weight
  its forward computed in this run (the forward made as F.cross_entropy makes them: log_softmax, then nll_loss)
  instead of computing them again.
- (CPU) 2-d max pooling with indices runs on a channels-last copy of its input (ATen's NCHW kernel is several times
  slower on small images) and hands back contiguous values and indices: the same maxima and the same
  (first-in-window) indices.
- `tuple_get` is bound to `operator.itemgetter`, and the compiled step runs each such projection right after
  the op that makes its tuple (`Compiled.plan`: one pass of the runner's loop per op, the same values, frees,
  memory limits and errors).

Which runs faster is measured, not assumed (`Tuned`): after a warm-up the step alternates between the plain and
the compiled calls for a few runs each, keeps the faster, and the decision is kept per template digest and
machine (`Decisions`; a worker keeps them on disk with its calibration figures) so that the next loop of the
same template starts with the faster one. A template whose compilation fails runs plain, with the reason
logged. On a CUDA device a step that nothing changes on the host from run to run is captured as one CUDA graph
at its first run (ravop/runtime/step_capture.py).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import operator
import os
import time
from typing import Any, Callable, Optional, Protocol, Sequence

import torch

from ..core import registry
from ..ops import loss_functions, optim
from ..ops.lr_schedule import scheduled_lr
from ..ops.masked import keep_masked
from ..ops.nn import _dropout_noise, max_pool2d
from .runner import At, PerRun, PlanEntry, Runner, check_in_place, op_seed, stream_id
from .step_capture import CapturedStep, blockers, cuda_capture

log = logging.getLogger(__name__)
aten = torch.ops.aten

DISABLE_ENV = "RAVOP_STEP_COMPILER"   # "off": every step runs plain (a reference for tests and debugging)
WARM_UP_RUNS = 2       # runs before timing: first calls allocate and warm caches
TRIAL_RUNS = 10        # timed runs of each variant, alternating; the fastest of each is compared (the
                       # least disturbed by other work on the machine)
MIN_GAIN = 0.03        # the compiled step must be this much faster to be kept (timer noise)


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("off", "0", "false", "no")


# ------------------------------------------------------------------------------------------------ decisions

class Decisions(Protocol):
    """Where decisions are kept: `load(key)` -> {"compiled": 0 or 1, ...} or None; `store(key, figures)`."""

    def load(self, key: str) -> Optional[dict[str, float]]: ...

    def store(self, key: str, figures: dict[str, float]) -> None: ...


class MemoryDecisions:
    """Decisions kept for the life of the process (in-process evaluation, tests)."""

    def __init__(self) -> None:
        self.figures: dict[str, dict[str, float]] = {}

    def load(self, key: str) -> Optional[dict[str, float]]:
        return self.figures.get(key)

    def store(self, key: str, figures: dict[str, float]) -> None:
        self.figures[key] = dict(figures)


IN_PROCESS = MemoryDecisions()


def template_digest(nodes: list[Any], inputs: list[int], device: str) -> str:
    """A digest of a step's ops (op names, params, declared shapes and dtypes, and which op reads which value,
    by position, not by id) and its device: the same model on the same batch shape gives the same digest in
    any graph."""
    position = {i: ("in", k) for k, i in enumerate(inputs)}
    h = hashlib.sha256(device.encode())
    for index, node in enumerate(nodes):
        position[node.id] = ("op", index)
        params = node.pkey or repr(sorted(node.params.items())).encode()
        h.update(repr((node.op, [position.get(i) for i in node.inputs], str(node.shape), str(node.dtype))).encode())
        h.update(params)
    return h.hexdigest()[:32]


# ------------------------------------------------------------------------------------------------ rewrites

class Compiled:
    """The compiled calls of a runner (same length and order) and what was rewritten; `run` runs them with
    each projection of a tuple folded into the op that makes the tuple (`plan`, made once from `calls`: code
    that wraps calls gives the runner a new list, and `Tuned` then runs that list as it is)."""

    def __init__(self, calls: list[Any], rewrites: dict[str, int], overwrites: dict[int, tuple[int, ...]]) -> None:
        self.calls, self.rewrites, self.overwrites = calls, rewrites, overwrites
        self.plan = _fold_projections(calls)

    def run(self, runner: Runner, at: Optional[At]) -> list[Any]:
        """A run of `runner` over `plan`: the same calls, values, frees, memory checks and errors (naming the
        same op), without a pass of the runner's loop per projection (a step of a small model has more
        projections than ops)."""
        return runner.run(at, self.plan)


def _fold_projections(calls: list[Any]) -> list[PlanEntry]:
    """`calls` as a plan (`Runner.run`): an op whose output only bound projections (`operator.itemgetter`, see
    `_bind_projections`) read carries them ((getter, their slot, their index), in order) and frees what they
    free; they have no entry of their own. A projection's value is defined once its tuple is (each value has
    its own slot), and nothing else reads the tuple, so setting it earlier and freeing the tuple with the op
    changes no value any call sees."""
    readers: dict[int, list[int]] = {}
    for index, (_, args, *_) in enumerate(calls):
        for a in args:
            readers.setdefault(a, []).append(index)
    projection = {index for index, (kernel, args, _, _, _, varies) in enumerate(calls)
                  if type(kernel) is operator.itemgetter and varies is None and len(args) == 1}
    plan: list[PlanEntry] = []
    folded: set[int] = set()
    for index, call in enumerate(calls):
        if index in folded:
            continue
        kernel, args, params, out, frees, varies = call
        read_by = readers.get(out, [])
        if index in projection or not read_by or not all(r in projection and r > index for r in read_by):
            plan.append((index, call, ()))
            continue
        frees = tuple(frees) + tuple(s for r in read_by for s in calls[r][4])
        plan.append((index, (kernel, args, params, out, frees, varies), tuple((calls[r][0], calls[r][3], r)
                                                                              for r in read_by)))
        folded.update(read_by)
    return plan


def compile_calls(runner: Runner) -> Compiled:
    """The rewrites of the module docstring applied to a copy of `runner.calls`."""
    calls = list(runner.calls)
    overwrites = dict(runner.overwrites)
    on_cpu = runner.device == "cpu"   # the same bits checked on CPU kernels only (a GPU's may fuse differently)
    rewrites = {"optimizer_groups": _group_optimizers(runner, calls, overwrites) if on_cpu else 0,
                "dropout_masks_kept": _keep_dropout_masks(runner, calls),
                "channels_last_pools": _channels_last_pools(runner, calls) if on_cpu else 0,
                "batch_norm_stats_kept": _keep_batch_norm_stats(runner, calls) if on_cpu else 0,
                "log_softmax_kept": _keep_log_softmax(runner, calls) if on_cpu else 0,
                "projections": _bind_projections(runner, calls)}
    # the rewritten list keeps the plain one's in-place contract (owned: what the plain list may overwrite)
    check_in_place(calls, overwrites, set().union(*runner.overwrites.values()), runner.kept, runner.nodes)
    return Compiled(calls, rewrites, overwrites)


def _bind_projections(runner: Runner, calls: list[Any]) -> int:
    n = 0
    for index, node in enumerate(runner.nodes):
        kernel, args, params, out, frees, varies = calls[index]
        if node.op == "tuple_get" and varies is None and type(params.get("index")) is int and len(params) == 1:
            calls[index] = (operator.itemgetter(params["index"]), args, {}, out, frees, None)
            n += 1
    return n


def _channels_last_pools(runner: Runner, calls: list[Any]) -> int:
    n = 0
    for index, node in enumerate(runner.nodes):
        kernel, args, params, out, frees, varies = calls[index]
        if node.op == "max_pool2d" and varies is None and kernel is registry.REGISTRY["max_pool2d"].kernel:
            calls[index] = (_max_pool2d_channels_last, args, params, out, frees, None)
            n += 1
    return n


def _max_pool2d_channels_last(x: torch.Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                              dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    if x.dim() != 4:
        return max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    out = max_pool2d(x.contiguous(memory_format=torch.channels_last), kernel_size, stride, padding, dilation,
                     ceil_mode, return_indices)
    if return_indices:
        return out[0].contiguous(), out[1].contiguous()
    return out.contiguous()


class _KeptNoise(PerRun):
    """A dropout's draw (as `PerRun` draws it: the same generator seed) that keeps its noise for the backward."""
    __slots__ = ("box",)
    box: list[Any]

    def __call__(self, kernel: Any, args: list[Any], params: dict[str, Any], at: Optional[At]) -> Any:
        p, training = params.get("p", 0.5), params.get("training", True)
        if not training or not 0 < p < 1:
            self.box[0] = None
            return PerRun.__call__(self, kernel, args, params, at)
        generator = torch.Generator().manual_seed(op_seed(self.graph_seed, stream_id(self.stream, self.stride, at)))
        x = args[0]
        noise = self.box[0] = _dropout_noise(x, p, generator)
        out = x * noise
        return out if self.device == "cpu" else out.to(self.device)


class _KeptOrRedrawn(PerRun):
    """A dropout backward's run: the gradient times the mask its forward kept in this run, or, where the forward
    did not draw one, the op as recorded (its seed worked out per run by `PerRun` only then)."""
    __slots__ = ("box",)
    box: list[Any]

    def __call__(self, kernel: Any, args: list[Any], params: dict[str, Any], at: Optional[At]) -> Any:
        noise, g = self.box[0], args[0]
        if noise is None or noise.shape != g.shape or noise.dtype != g.dtype:   # the forward did not draw
            return PerRun.__call__(self, kernel, args, params, at)
        return g * noise


def _keep_dropout_masks(runner: Runner, calls: list[Any]) -> int:
    """Pair each dropout_backward with the dropout whose stream it follows, in the same run of the step."""
    index_of = {node.id: index for index, node in enumerate(runner.nodes)}
    n = 0
    for index, node in enumerate(runner.nodes):
        if node.op != "dropout_backward":
            continue
        kernel, args, params, out, frees, varies = calls[index]
        if varies is None or varies.seed_from is None or varies.counted is not None:
            continue
        source, stride = varies.seed_from
        forward = index_of.get(source)
        if forward is None or forward >= index or runner.nodes[forward].op != "dropout":
            continue
        f_kernel, f_args, f_params, f_out, f_frees, f_varies = calls[forward]
        if type(f_varies) is not PerRun or f_varies.stream != source or f_varies.stride != stride or \
                f_varies.counted is not None or f_varies.seed_from is not None or \
                f_params.get("p", 0.5) != params.get("p"):
            continue
        box: list[Any] = [None]
        calls[forward] = (f_kernel, f_args, f_params, f_out, f_frees, _sharing(_KeptNoise, f_varies, box))
        # the backward keeps its per-run seed: a forward that did not draw leaves the redraw to it
        calls[index] = (kernel, args, params, out, frees, _sharing(_KeptOrRedrawn, varies, box))
        n += 1
    return n


def _sharing(kind: type, varies: PerRun, box: list[Any]) -> Any:
    """`varies` (what changes per run of an op) as a `kind`, the subclass that hands the mask over in `box`."""
    made = kind(varies.opdef, varies.graph_seed, varies.device, varies.stream, varies.stride, varies.counted,
                varies.seed_from)
    made.box = box
    return made


def _batch_norm_keeping(box: list[Any], x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
                        weight: Any = None, bias: Any = None, training: bool = True, momentum: float = 0.1,
                        eps: float = 1e-5) -> Any:
    """ravop.ops.nn.batch_norm, keeping (x, mean, inverse std) of a training batch for the backward."""
    mean, var = running_mean.detach().clone(), running_var.detach().clone()
    y, save_mean, save_invstd = aten.native_batch_norm(x, weight, bias, mean, var, training, momentum, eps)
    box[:] = (x, save_mean, save_invstd) if training else (None, None, None)
    return y, mean, var


def _batch_norm_backward_kept(box: list[Any], g: torch.Tensor, x: torch.Tensor, running_mean: Any,
                              running_var: Any, weight: Any = None, training: bool = True, eps: float = 1e-5,
                              mask: Any = (True, True, True)) -> Any:
    if not training or box[0] is not x:   # not this run's forward of this input: as recorded
        return registry.REGISTRY["batch_norm_backward"].kernel(g, x, running_mean, running_var, weight, training,
                                                                eps, mask)
    grads = aten.native_batch_norm_backward(g, x, weight, running_mean, running_var, box[1], box[2], training, eps,
                                            list(mask))
    return keep_masked(mask, *grads)


def _keep_batch_norm_stats(runner: Runner, calls: list[Any]) -> int:
    """Pair each batch_norm_backward with the batch_norm that normalised the same value with the same eps."""
    forward_kernel = registry.REGISTRY["batch_norm"].kernel
    backward_kernel = registry.REGISTRY["batch_norm_backward"].kernel
    forwards: dict[int, tuple[int, list[Any]]] = {}   # slot of x -> (index, box)
    n = 0
    for index, node in enumerate(runner.nodes):
        kernel, args, params, out, frees, varies = calls[index]
        if varies is not None or not args:
            continue
        if node.op == "batch_norm" and kernel is forward_kernel and params.get("training", True):
            box: list[Any] = [None, None, None]
            forwards[args[0]] = (index, box)
            calls[index] = (functools.partial(_batch_norm_keeping, box), args, params, out, frees, None)
        elif node.op == "batch_norm_backward" and kernel is backward_kernel and len(args) >= 2 and \
                args[1] in forwards and params.get("training", True):
            forward, box = forwards[args[1]]
            if calls[forward][2].get("eps", 1e-5) != params.get("eps", 1e-5):
                continue
            calls[index] = (functools.partial(_batch_norm_backward_kept, box), args, params, out, frees, None)
            n += 1
    return n


def _cross_entropy_keeping(box: list[Any], y_true: torch.Tensor, y_pred: torch.Tensor, ignore_index: Any = None,
                           reshape_target: Any = None, reshape_label: Any = None) -> torch.Tensor:
    """ravop.ops.loss_functions.cross_entropy_loss with class indices, as F.cross_entropy computes it (log_softmax,
    then nll_loss), keeping (y_pred, log-probabilities, total weight) for the backward; other targets as the op."""
    label, pred = loss_functions._inputs(y_true, y_pred, reshape_target, reshape_label)
    if label.is_floating_point() or pred.dim() > 2:
        box[0] = None
        return registry.REGISTRY["cross_entropy_loss"].kernel(y_true, y_pred, ignore_index, reshape_target,
                                                               reshape_label)
    logp = torch.log_softmax(pred, 0 if pred.dim() == 1 else 1)
    loss, total_weight = aten.nll_loss_forward(logp, label, None, loss_functions.MEAN,
                                               loss_functions.torch_ignore_index(ignore_index))
    box[:] = (y_pred, logp, total_weight)
    return loss


def _cross_entropy_backward_kept(box: list[Any], g: torch.Tensor, y_true: torch.Tensor, y_pred: torch.Tensor,
                                 ignore_index: Any = None, reshape_target: Any = None, reshape_label: Any = None,
                                 mask: Any = (False, True)) -> Any:
    if box[0] is not y_pred or mask[0]:   # not this run's forward of this input: as recorded
        return registry.REGISTRY["cross_entropy_loss_backward"].kernel(g, y_true, y_pred, ignore_index,
                                                                        reshape_target, reshape_label, mask)
    _, logp, total_weight = box
    label, pred = loss_functions._inputs(y_true, y_pred, reshape_target, reshape_label)
    g_logp = loss_functions.nll_loss_backward(g, logp, label, loss_functions.torch_ignore_index(ignore_index),
                                              total_weight)
    g_pred = aten._log_softmax_backward_data(g_logp, logp, 0 if pred.dim() == 1 else 1, pred.dtype)
    return keep_masked(mask, None, g_pred.reshape(y_pred.shape))


def _keep_log_softmax(runner: Runner, calls: list[Any]) -> int:
    """Pair each cross_entropy_loss_backward with the cross_entropy_loss of the same inputs and params."""
    forward_kernel = registry.REGISTRY["cross_entropy_loss"].kernel
    backward_kernel = registry.REGISTRY["cross_entropy_loss_backward"].kernel
    forwards: dict[tuple[int, ...], tuple[list[Any], dict[str, Any]]] = {}   # (y_true, y_pred slots) -> box
    n = 0
    for index, node in enumerate(runner.nodes):
        kernel, args, params, out, frees, varies = calls[index]
        if varies is not None or len(args) < 2:
            continue
        if node.op == "cross_entropy_loss" and kernel is forward_kernel:
            box: list[Any] = [None, None, None]
            forwards[tuple(args[:2])] = (box, params)
            calls[index] = (functools.partial(_cross_entropy_keeping, box), args, params, out, frees, None)
        elif node.op == "cross_entropy_loss_backward" and kernel is backward_kernel and len(args) == 3 and \
                tuple(args[1:]) in forwards:
            box, forward_params = forwards[tuple(args[1:])]
            if {k: v for k, v in params.items() if k != "mask"} != forward_params:
                continue
            calls[index] = (functools.partial(_cross_entropy_backward_kept, box), args, params, out, frees, None)
            n += 1
    return n


# ---- optimizer steps

def _foreach_rmsprop(params: list[torch.Tensor], grads: list[torch.Tensor], square_avgs: list[torch.Tensor],
                     momentum_buffers: list[torch.Tensor], grad_avgs: list[torch.Tensor], step: int, lr: float,
                     alpha: float, eps: float, weight_decay: float, momentum: float, centered: bool, maximize: bool,
                     lr_schedule: Any) -> list[tuple[Any, ...]]:
    """ravop.ops.optim.rmsprop_step (on copies, as the op) for many tensors: the same kernels in the same order."""
    lr = scheduled_lr(lr, lr_schedule, step)
    params, square_avgs = [p.clone() for p in params], [s.clone() for s in square_avgs]
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_mul_(square_avgs, alpha)
    torch._foreach_addcmul_(square_avgs, grads, grads, 1 - alpha)
    if centered:
        grad_avgs = [g.clone() for g in grad_avgs]
        torch._foreach_lerp_(grad_avgs, grads, 1 - alpha)
        avg = torch._foreach_addcmul(square_avgs, grad_avgs, grad_avgs, -1)
        torch._foreach_sqrt_(avg)
    else:
        avg = torch._foreach_sqrt(square_avgs)
    torch._foreach_add_(avg, eps)
    if momentum > 0:
        momentum_buffers = [b.clone() for b in momentum_buffers]
        torch._foreach_mul_(momentum_buffers, momentum)
        torch._foreach_addcdiv_(momentum_buffers, grads, avg)
        torch._foreach_add_(params, momentum_buffers, alpha=-lr)
    else:
        torch._foreach_addcdiv_(params, grads, avg, -lr)
    return list(zip(params, square_avgs, momentum_buffers, grad_avgs))


def _adam_group(args: tuple[Any, ...], decoupled: bool, step: int, lr: float = 0.001, beta1: float = 0.9,
                beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False,
                maximize: bool = False, lr_schedule: Any = None, fused: bool = False) -> list[tuple[Any, ...]]:
    params, grads, exp_avgs, exp_avg_sqs, maxes = (list(args[k::5]) for k in range(5))
    optim.adam_update_(params, grads, exp_avgs, exp_avg_sqs, maxes, step, scheduled_lr(lr, lr_schedule, step), beta1,
                       beta2, eps, weight_decay, amsgrad, maximize, decoupled, fused)
    return list(zip(params, exp_avgs, exp_avg_sqs, maxes))


def _rmsprop_group(args: tuple[Any, ...], decoupled: bool, step: int = 1, lr: float = 0.01, alpha: float = 0.99,
                   eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                   maximize: bool = False, lr_schedule: Any = None) -> list[tuple[Any, ...]]:
    # `decoupled` is Adam's: the groups share one signature
    params, grads, square_avgs, momentum_buffers, grad_avgs = (list(args[k::5]) for k in range(5))
    return _foreach_rmsprop(params, grads, square_avgs, momentum_buffers, grad_avgs, step, lr, alpha, eps,
                            weight_decay, momentum, centered, maximize, lr_schedule)


# op -> (the group's update, decoupled weight decay, whether only the in-place variant is grouped, the positions
# of the arguments it overwrites in place)
_GROUPED = {"adam_step": (_adam_group, False, True, (0, 2, 3)),
            "adamw_step": (_adam_group, True, True, (0, 2, 3)),
            "rmsprop_step": (_rmsprop_group, False, False, ())}


class _Group:
    """The kernel of the first op of a group: updates every member's tensors, keeps their results in `box`
    (the members after it hand theirs out), returns its own."""
    __slots__ = ("box", "update", "decoupled")

    def __init__(self, op: str, n: int) -> None:
        self.update: Callable[..., list[tuple[Any, ...]]] = _GROUPED[op][0]   # type: ignore[assignment]
        self.decoupled = bool(_GROUPED[op][1])
        self.box: list[Any] = [None] * n

    def __call__(self, *args: Any, **params: Any) -> Any:
        self.box[:] = self.update(args, self.decoupled, **params)
        return self.box[0]


def _settings(opdef: registry.OpDef, params: dict[str, Any]) -> Optional[str]:
    full = {**opdef.params, **params}
    if full.get("amsgrad") or any(v is registry.REQUIRED for k, v in full.items() if k != "step"):
        return None
    return repr(sorted((k, v) for k, v in full.items() if k != "step"))


def _group_optimizers(runner: Runner, calls: list[Any], overwrites: dict[int, tuple[int, ...]]) -> int:
    """Group the optimizer steps (Adam and AdamW updating in place, RMSprop) with the same settings and step
    counter into foreach updates; the group's call overwrites what its members did (`overwrites`)."""
    n_inputs = runner.n_inputs
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, node in enumerate(runner.nodes):
        if node.op not in _GROUPED:
            continue
        opdef = registry.REGISTRY[node.op]
        in_place_only = _GROUPED[node.op][2]
        kernel, args, params, out, frees, varies = calls[index]
        wanted = opdef.in_place.kernel if in_place_only and opdef.in_place is not None else \
            None if in_place_only else opdef.kernel
        if kernel is not wanted or len(args) != 5:
            continue   # Adam on copies (the loop does not own these values): left alone
        settings = _settings(opdef, params)
        counted = None if varies is None else varies.counted
        if settings is None or (varies is not None and (type(varies) is not PerRun or varies.seed_from is not None)) \
                or (varies is None and type(params.get("step")) is not int):
            continue
        key = (node.op, settings, counted, None if varies is not None else params.get("step"))
        groups.setdefault(key, []).append(index)
    made = 0
    for members in groups.values():
        op = runner.nodes[members[0]].op
        if len(members) < 2 or not _groupable(runner, calls, members, n_inputs, _GROUPED[op][3]):
            continue
        first = members[0]
        group = _Group(op, len(members))
        kernel, args, params, out, frees, varies = calls[first]
        every = tuple(a for m in members for a in calls[m][1])
        calls[first] = (group, every, params, out, frees, varies)
        if first in overwrites:
            overwrites[first] = tuple(s for m in members for s in overwrites.pop(m, ()))
        for k, m in enumerate(members[1:], 1):
            _, _, _, out_m, frees_m, _ = calls[m]
            calls[m] = (functools.partial(operator.getitem, group.box, k), (), {}, out_m, frees_m, None)
        made += 1
    return made


def _groupable(runner: Runner, calls: list[Any], members: list[int], n_inputs: int,
               overwrites: Sequence[int]) -> bool:
    """Whether running every member at the first one's place changes nothing: each reads only values made
    before that place, the values they overwrite are distinct and read by nothing else, and nothing between
    the first and the last member reads them."""
    first = members[0]
    overwritten = [calls[m][1][p] for m in members for p in overwrites]
    if len(set(overwritten)) != len(overwritten):
        return False
    targets = set(overwritten)
    for m in members:
        args = calls[m][1]
        if any(a >= n_inputs and a - n_inputs >= first for a in args):
            return False   # made after the first member
        if any(a in targets for k, a in enumerate(args) if k not in overwrites):
            return False
    chosen = set(members)
    for index in range(first, members[-1]):
        if index not in chosen and any(a in targets for a in calls[index][1]):
            return False
    return True


# ------------------------------------------------------------------------------------------------ the choice

class Tuned:
    """A step's runner choosing between its plain calls and the compiled ones by timing them in flight (both
    give the same bits); with a decision already kept for its digest it starts with that one."""

    def __init__(self, runner: Runner, compiled: Compiled, key: str, decisions: Decisions,
                 capture: Optional[tuple[list[int], list[int]]] = None, runs: Optional[int] = None) -> None:
        """`capture`: (input slots, output slots) of a step to capture as a CUDA graph at its first run; `runs`:
        how often the step will run, if known. A step that runs too few times to be measured (a fit's short
        last batch runs once an epoch) runs compiled, undecided: the same bits, with the work the rewrites save."""
        self.runner, self.compiled, self.key, self.decisions = runner, compiled, key, decisions
        self.capture = capture
        self.captured: Optional[CapturedStep] = None
        self.plain_calls = runner.calls
        self.times: dict[bool, list[float]] = {False: [], True: []}
        self.runs = 0
        kept = decisions.load(key)
        self.decided: Optional[bool] = None if kept is None else bool(kept.get("compiled"))
        if self.decided is None and runs is not None and runs < WARM_UP_RUNS + 2 * TRIAL_RUNS:
            self.decided = True
        self._use(self.decided is not False)

    def _use(self, compiled: bool) -> None:
        self.runner.calls = self.compiled.calls if compiled else self.plain_calls

    def run(self, at: Optional[At]) -> list[Any]:
        if self.capture is not None:   # once, with the first run's inputs, over the chosen calls
            self.captured = cuda_capture(self.runner, *self.capture)
            self.capture = None
        if self.captured is not None:
            return self.captured.run(at)
        if self.decided is not None:
            return self._run(at)
        self.runs += 1
        if self.runs <= WARM_UP_RUNS:
            self._use(self.runs % 2 == 1)
            return self._run(at)
        compiled = self.runs % 2 == 1
        self._use(compiled)
        start = time.perf_counter()
        values = self._run(at)
        self.times[compiled].append(time.perf_counter() - start)
        if len(self.times[True]) >= TRIAL_RUNS and len(self.times[False]) >= TRIAL_RUNS:
            self._decide()
        return values

    def _run(self, at: Optional[At]) -> list[Any]:
        """A run of the chosen calls: the compiled ones through their plan (calls wrapped since, a new list as
        bench_step's profile makes, run as they are)."""
        if self.runner.calls is self.compiled.calls:
            return self.compiled.run(self.runner, at)
        return self.runner.run(at)

    def _decide(self) -> None:
        plain, compiled = min(self.times[False]), min(self.times[True])
        self.decided = compiled < plain * (1 - MIN_GAIN)
        self._use(self.decided)
        figures = {"compiled": float(self.decided), "plain_us": plain * 1e6, "compiled_us": compiled * 1e6,
                   **{k: float(v) for k, v in self.compiled.rewrites.items()}}
        log.info("step template %s: plain %.0f us, compiled %.0f us per run: %s (%s)", self.key[:12],
                 plain * 1e6, compiled * 1e6, "compiled" if self.decided else "plain", self.compiled.rewrites)
        self.decisions.store(self.key, figures)

    def plain(self) -> None:
        """Run op by op from now on (a traced or instrumented step: hooks wrap the plain calls)."""
        self.decided = False
        self.capture = self.captured = None
        self._use(False)


def tune(runner: Runner, nodes: list[Any], inputs: list[int], decisions: Optional[Decisions],
         holes: Sequence[int] = (), results: Sequence[int] = (), runs: Optional[int] = None) -> Optional[Tuned]:
    """A `Tuned` chooser for `runner` (a step template's, built; `inputs` the ids of its inputs, of which
    `holes` change per run, and `results` the ids it hands out; `runs`: how often it will run, if known), or
    None where nothing applies: compiling off (`$RAVOP_STEP_COMPILER=off`, or `decisions` None), no rewrite found
    and no CUDA graph to capture, or compiling failed (logged)."""
    if decisions is None or not enabled():
        return None
    try:
        compiled = compile_calls(runner)
        capture = None
        if runner.device.startswith("cuda") and not blockers(runner):
            capture = ([runner.slot[i] for i in holes], [runner.slot[i] for i in results])
        if not any(compiled.rewrites.values()) and capture is None:
            return None
        return Tuned(runner, compiled, template_digest(nodes, inputs, runner.device), decisions, capture, runs)
    except Exception as exc:   # a rewrite's bug must never stop a loop: the plain step is always right
        log.warning("step template not compiled, running op by op: %s: %s", type(exc).__name__, exc)
        return None
