"""A loop's fills (compiler/partition.py, worker/loops/loop_subgraph.py): the ops that read nothing and that only loops
read (Adam's zero moments of a weight too big for constant folding) are made in the loop's own subgraph, so a fit
is one subgraph with no hop and no upload before its loop; the bits, a resume from a checkpoint and
verify='spot' are unchanged."""
import numpy as np
import pytest
import torch

from compiler import compile_graph
from compiler.passes.fold import MAX_ELEMENTS
import ravop as R
from helpers import on_one_thread, wait_for
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.core.errors import PlanError
from ravop.core.node import Node
from ravop.record.graph import current_graph
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import GraphKeys
from ravop.store import graphs as store_graphs
from ravop.wire import plan_pb2, unpack_nodes
from worker.execute.validate import check_nodes
from worker.loops.loop_subgraph import check_loop_program, loop_inputs

RNG = np.random.default_rng(4)
X = RNG.normal(size=(40, 4))
Y = np.eye(3)[RNG.integers(0, 3, 40)]
WIDE, NEXT = 80, 72   # the second weight, 80 x 72, is above constant folding's limit: its Adam moments are fills
assert WIDE * NEXT > MAX_ELEMENTS


def record_fit(name, epochs, verify=1, seed=6):
    graph = R.Graph(name=name, seed=seed, verify=verify)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(WIDE, input_shape=(4,)), Activation("relu"), Dense(NEXT), Activation("relu"), Dense(3)):
        model.add(layer)
    names = [*model.fit(X, Y, n_epochs=epochs, batch_size=8, shuffle=True), "prediction"]
    model.predict(X).persist_op("prediction")
    return graph, names


def subgraph_ops(compiled):
    return [[node.op for node in unpack_nodes(sub.nodes)] for sub in compiled.plan.subgraphs]


def test_a_fits_zero_moments_are_made_in_its_loop_subgraph_not_one_of_their_own():
    record_fit("fills", epochs=2)
    compiled = compile_graph(current_graph())
    loops = [ops for ops in subgraph_ops(compiled) if "loop" in ops]
    assert len(loops) == 1
    ops = loops[0]
    at = ops.index("loop")
    assert at >= 1 and set(ops[:at]) == {"zeros"}   # the fills first, then the loop and its tuple_gets
    assert set(ops[at + 1:]) <= {"tuple_get"}
    assert not any(set(other) == {"zeros"} for other in subgraph_ops(compiled))   # no subgraph of zeros alone
    sub = next(sub for sub in compiled.plan.subgraphs if sub.HasField("loop"))
    fills = [node.id for node in unpack_nodes(sub.nodes)[:at]]
    assert not set(fills) & set(sub.inputs) and not set(fills) & set(sub.outputs)


def test_a_fill_another_op_reads_stays_a_value_handed_over():
    record_fit("shared", epochs=2)
    (R.zeros((NEXT, WIDE)) + 1).persist_op("ones")   # the same zeros as the moments' (merged by CSE)
    compiled = compile_graph(current_graph())
    sub = next(sub for sub in compiled.plan.subgraphs if sub.HasField("loop"))
    assert [node.op for node in unpack_nodes(sub.nodes)][0] == "loop"
    assert len(compiled.plan.subgraphs) >= 2


@pytest.mark.parametrize("resident", [True, False])
def test_a_fill_several_loops_read_is_made_in_each(resident):
    """DiLoCo's replicas start from the same zero moments: each replica's worker makes them, none waits for a hop."""
    R.Graph(name="replicas", seed=3)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(WIDE, input_shape=(4,)), Activation("relu"), Dense(NEXT), Activation("relu"), Dense(3)):
        model.add(layer)
    model.fit(X, Y, n_epochs=2, batch_size=4, shuffle=True, strategy=R.parallel.DiLoCo(2, 2, resident=resident))
    compiled = compile_graph(current_graph())
    loops = [sub for sub in compiled.plan.subgraphs if sub.HasField("loop")]
    assert len(loops) >= 2
    fills = [{node.id for node in unpack_nodes(sub.nodes) if node.op == "zeros"} for sub in loops]
    starting = [ids for ids, sub in zip(fills, loops) if ids]
    assert len(starting) >= 2 and set.intersection(*starting)   # the merged zeros, made by each replica's worker
    for sub, ids in zip(loops, fills):
        assert not ids & set(sub.inputs)
    assert not any(set(ops) == {"zeros"} for ops in subgraph_ops(compiled))


def _node(id, op, inputs=(), shape=(2, 2)):
    return Node(id, op, tuple(inputs), {"shape": shape} if op == "zeros" else {}, b"", shape, torch.float32, "t.py:1")


def _program(steps, inputs, outputs):
    return check_nodes(steps, inputs, outputs, 1 << 30)


def test_the_worker_accepts_fills_before_the_loop_and_makes_them():
    steps = [_node(5, "zeros"), _node(6, "loop", (1, 5)), _node(7, "tuple_get", (6,))]
    program = _program(steps, [1], [7])
    loop = check_loop_program(program)
    assert loop is steps[1]
    given = torch.ones(2, 2)
    values = loop_inputs(program, loop, {1: given}, 0, "cpu", 1 << 30, 1 << 30)
    assert values[0] is given and torch.equal(values[1], torch.zeros(2, 2))


@pytest.mark.parametrize("steps, outputs, message", [
    ([_node(5, "relu", (1,)), _node(6, "loop", (5,)), _node(7, "tuple_get", (6,))], [7], "must start with its loop"),
    ([_node(5, "zeros"), _node(7, "tuple_get", (1,))], [7], "must start with its loop"),
    ([_node(5, "zeros"), _node(6, "loop", (5,)), _node(7, "tuple_get", (6,))], [5, 7], "not node 5"),
    ([_node(6, "loop", (1,)), _node(7, "zeros")], [], "not 'zeros'"),
])
def test_the_worker_refuses_a_loop_subgraph_that_holds_more(steps, outputs, message):
    with pytest.raises(PlanError, match=message):
        check_loop_program(_program(steps, [1], outputs))


def assert_loop_first_with_fills(client, keys):
    """The stored plan's subgraph 0 is the loop, and it makes its fills itself."""
    sub = plan_pb2.Subgraph.FromString(client.hget(keys.subgraphs, 0))
    ops = [node.op for node in unpack_nodes(sub.nodes)]
    assert sub.HasField("loop") and ops[0] == "zeros" and sub.n_predecessors == 0, ops


def assert_same_as_in_process(graph, names):
    want = on_one_thread(evaluate_persisted, graph, names)
    for name in names:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name


def test_a_fit_with_fills_resumes_on_another_worker_with_the_same_bits(engine, workers, client):
    names = workers.start(2, reclaim_idle=1.0, extra=("--checkpoint-steps", "25"))
    graph, persisted = record_fit("fills resumed", epochs=300)
    R.activate()
    keys = GraphKeys(engine.token, graph.id)
    assert_loop_first_with_fills(client, keys)
    R.execute()
    wait_for(lambda: client.hget(keys.checkpoint(0), "step"), "a checkpoint")
    holder = client.hget(keys.taken, 0).decode()
    workers.kill(holder)
    assert store_graphs.steps_done(client, keys) < 300 * 5, "the loop ended before the kill: make it longer"
    R.track_progress(timeout=300, progress_bar=False)
    assert client.hget(keys.ran, 0).decode() == next(n for n in names if n != holder)
    assert_same_as_in_process(graph, persisted)


def test_a_fit_with_fills_under_spot_checks_gives_the_unverified_bits(engine, workers, client):
    workers.start(2, extra=("--checkpoint-steps", "5"))
    graph, persisted = record_fit("fills spot", epochs=6, verify="spot")
    R.activate()
    assert_loop_first_with_fills(client, GraphKeys(engine.token, graph.id))
    R.execute()
    R.track_progress(progress_bar=False, timeout=600)
    assert_same_as_in_process(graph, persisted)
