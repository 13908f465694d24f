"""Run a loop subgraph (a `loop` op and its tuple_get readers): the steps run here, one after another, with
the carried values (parameters, optimizer state) kept in this worker's memory (`ravop.loop_run`).

While it runs, the worker writes what the steps persist (the batch losses) every `FLUSH_SECONDS`, with the
number of steps done (what `R.track_progress` shows), and a checkpoint of the carried values every
`checkpoint_steps` steps or `checkpoint_seconds` seconds, whichever comes first. Each write is one MULTI/EXEC,
so a checkpoint and the persisted values up to it land together. A worker that takes over the subgraph
after a crash resumes from the checkpoint; steps are deterministic, so it computes the same bits, and it
writes persisted values with SET NX: a value written before the crash is never written again.
"""
import time

from ravop.errors import PlanError
from ravop.interpreter import run_nodes
from ravop.loop_run import LoopRun
from ravop.wire import decode_tensor, encode_tensor

from . import device as devices

FLUSH_SECONDS = 0.25
CHECKPOINT_SECONDS = 10.0
CHECKPOINT_STEPS = 1000


class LoopAbandoned(Exception):
    """The loop's graph stopped running (failed elsewhere, or flushed): stop the loop."""


def check_loop_program(program):
    """The loop step of a checked subgraph; `PlanError` unless it is one loop op and tuple_gets of it."""
    steps = program.steps
    if not steps or steps[0].op != "loop":
        raise PlanError("a loop subgraph must start with its loop op")
    for step in steps[1:]:
        if step.op != "tuple_get" or list(step.inputs) != [steps[0].id]:
            raise PlanError(f"a loop subgraph holds only its loop op and tuple_gets of it, not {step.op!r}", step)
    if steps[0].id in program.outputs:
        raise PlanError("a loop subgraph's outputs are tuple_gets of its loop op, not the loop op itself", steps[0])
    return steps[0]


class _Writer:
    """Collects what the steps persist and writes it, with progress and checkpoints, as the loop goes."""

    def __init__(self, client, keys, subgraph_id, first_ids, checkpoint_steps, checkpoint_seconds):
        self.client, self.keys, self.subgraph_id = client, keys, subgraph_id
        self.first_ids = first_ids
        self.checkpoint_steps, self.checkpoint_seconds = checkpoint_steps, checkpoint_seconds
        self.pending = {}
        now = time.monotonic()
        self.last_flush = self.last_checkpoint = now
        self.checkpointed = 0

    def on_step(self, done, template, run, outputs, carried):
        for first, value in zip(self.first_ids[template], outputs):
            self.pending[first + run] = value
        now = time.monotonic()
        if (self.checkpoint_steps and done - self.checkpointed >= self.checkpoint_steps) or \
                now - self.last_checkpoint >= self.checkpoint_seconds:
            self.write(done, carried)
        elif now - self.last_flush >= FLUSH_SECONDS:
            self.write(done)

    def write(self, done, carried=None):
        keys = self.keys
        pipe = self.client.pipeline(transaction=True)
        for tensor_id, value in self.pending.items():
            pipe.set(keys.tensor(tensor_id), encode_tensor(devices.to_host(value)), nx=True)
        pipe.hset(keys.steps, self.subgraph_id, done)
        if carried is not None:
            checkpoint = keys.checkpoint(self.subgraph_id)
            pipe.delete(checkpoint)
            pipe.hset(checkpoint, mapping={"step": done, **{f"c{k}": encode_tensor(devices.to_host(value))
                                                            for k, value in enumerate(carried)}})
            self.checkpointed, self.last_checkpoint = done, time.monotonic()
        pipe.hget(keys.meta, "state")
        state = pipe.execute()[-1]
        self.pending = {}
        self.last_flush = time.monotonic()
        if state != b"running":
            raise LoopAbandoned(state)


def run_loop(client, keys, subgraph_id, subgraph, program, inputs, seed, device,
             checkpoint_steps=CHECKPOINT_STEPS, checkpoint_seconds=CHECKPOINT_SECONDS):
    """{output id: tensor} of a loop subgraph; resumes from its checkpoint if an earlier run left one."""
    loop_step = check_loop_program(program)
    runner = LoopRun(subgraph.loop, [inputs[i] for i in loop_step.inputs], seed, device)
    start, carried = 0, None
    saved = client.hgetall(keys.checkpoint(subgraph_id))
    if saved:
        start = int(saved[b"step"])
        carried = [devices.to_device(decode_tensor(saved[f"c{k}".encode()]), device)
                   for k in range(subgraph.loop.n_carried)]
    first_ids = [list(t.output_first_ids) for t in subgraph.loop.templates]
    if any(len(ids) != len(t.output_nodes) for ids, t in zip(first_ids, subgraph.loop.templates)):
        raise PlanError("a loop step's persisted values and their tensor ids do not pair up")
    writer = _Writer(client, keys, subgraph_id, first_ids, checkpoint_steps, checkpoint_seconds)
    carried = runner.run(carried, start, writer.on_step)
    writer.write(subgraph.loop.n_steps)
    env = {loop_step.id: tuple(carried)}
    run_nodes(program.steps[1:], env)
    return {o: env[o].contiguous() for o in program.outputs}
