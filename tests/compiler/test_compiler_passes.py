"""Each compiler pass on small hand-made graphs, and the pipeline's invariant checks."""
from dataclasses import replace

import pytest
import torch

from compiler import InvariantError, compile_graph
from compiler.cost import node_seconds
from compiler.ir import from_graph
from compiler.pass_manager import PIPELINE, check_invariants, run_pipeline
from compiler.passes import (eliminate_common_subexpressions, eliminate_dead_code, fold_constants,
                             fuse_linear_chains)
import ravop as R
from ravop.core.loop_template import LoopRecord
from ravop.record.loop import Loop
from ravop.runtime.evaluate import evaluate


@pytest.fixture(autouse=True)
def graph():
    return R.Graph(name="passes")


def big(*shape):
    """A constant too large to fold, so ops on it stay in the compiled graph."""
    return R.t(torch.arange(float(torch.Size(shape).numel())).reshape(shape) / 1000)


# ------------------------------------------------------------------------------------------ dead code

def test_dce_keeps_only_what_persisted_outputs_need(graph):
    x = big(100, 100)
    unused_const = R.t([1.0, 2.0])
    y = x.exp()
    dead = y.neg().square()
    z = y.sum()
    z.persist_op("z")
    ir, removed = eliminate_dead_code(from_graph(graph))
    assert set(ir.nodes) == {x.id, y.id, z.id}
    assert removed == 3  # unused_const, dead and the neg it reads
    assert set(ir.constants) == {x.id} and unused_const.id not in ir.constants and dead.id not in ir.nodes
    assert ir.outputs == {"z": z.id}


def test_dce_with_nothing_persisted_removes_everything(graph):
    big(3, 3000).exp()
    ir, removed = eliminate_dead_code(from_graph(graph))
    assert ir.nodes == {} and removed == 2


# --------------------------------------------------------------------------------- common subexpressions

def test_cse_merges_duplicates_and_repoints_readers_and_outputs(graph):
    x, w = big(50, 100), big(100, 10)
    a1, a2 = x @ w, x @ w
    b1, b2 = a1.exp(), a2.exp()          # identical only once a2 is merged into a1
    out = b1 + b2
    b2.persist_op("b2")
    out.persist_op("out")
    ir, merged = eliminate_common_subexpressions(from_graph(graph))
    assert merged == 2
    assert a2.id not in ir.nodes and b2.id not in ir.nodes
    assert ir.nodes[out.id].inputs == (b1.id, b1.id)
    assert ir.outputs == {"b2": b1.id, "out": out.id}
    check_invariants(ir)


def test_cse_keeps_ops_that_differ_in_params_or_param_types(graph):
    x = big(40, 40)
    sums = [x.sum(axis=0), x.sum(axis=1), x.sum(axis=0)]
    clips = [R.clip(x, 1, 2), R.clip(x, 1.0, 2)]   # equal in Python (1 == 1.0), yet one gives float32, one int
    ir, merged = eliminate_common_subexpressions(from_graph(graph))
    assert merged == 1 and sums[2].id not in ir.nodes and sums[1].id in ir.nodes
    assert all(c.id in ir.nodes for c in clips)


def test_cse_never_merges_random_ops(graph):
    r1, r2 = R.random(size=(4, 4)), R.random(size=(4, 4))
    x = big(8, 600)
    d1, d2 = R.dropout(x, p=0.5), R.dropout(x, p=0.5)
    ir, merged = eliminate_common_subexpressions(from_graph(graph))
    assert merged == 0
    assert {r1.id, r2.id, d1.id, d2.id} <= set(ir.nodes)


# ----------------------------------------------------------------------------------------------- folding

def test_folding_computes_small_constant_subgraphs_with_the_same_ids(graph):
    a, b = R.t([[1.0, 2.0], [3.0, 4.0]]), R.t([[0.5], [2.0]])
    c = (a @ b).exp() + 1.0
    x = big(10, 1000)
    y = x * c.sum()                              # x is too big to fold: y stays, reading a folded constant
    y.persist_op("y")
    ir, _ = eliminate_dead_code(from_graph(graph))
    ir, folded = fold_constants(ir)
    assert ir.nodes[c.id].op == "const" and ir.nodes[c.id].shape == c.shape
    torch.testing.assert_close(ir.constants[c.id], evaluate(c))
    assert ir.nodes[y.id].op == "mul" and y.id not in ir.constants
    assert folded == 4                          # matmul, exp, add, sum
    check_invariants(ir)
    ir, removed = eliminate_dead_code(ir)       # only the folded sum is read now
    assert removed == 6 and set(ir.nodes) == {x.id, y.inputs[1].id, y.id}


def test_folding_leaves_big_results_random_ops_and_unknown_shapes(graph):
    big_result = R.t([1.0]) + R.zeros((70, 70))  # 4900 elements: more than the folding limit
    rand = R.random(size=(3,)) + R.t([1.0, 1.0, 1.0])
    uniq = R.unique(R.t([3, 1, 3]))             # shape (-1,): known only when it runs
    ir, folded = fold_constants(from_graph(graph))
    assert ir.nodes[big_result.id].op == "add"
    assert ir.nodes[rand.id].op == "add" and ir.nodes[rand.inputs[0].id].op == "random"
    assert ir.nodes[uniq.id].op == "unique"
    assert folded == 0


def test_folding_leaves_a_failing_kernel_to_the_worker(graph):
    singular = R.inv(R.t([[1.0, 2.0], [2.0, 4.0]]))
    ir, folded = fold_constants(from_graph(graph))
    assert folded == 0 and ir.nodes[singular.id].op == "inv"


def test_folding_work_is_bounded_per_compile(graph):
    y = R.t([1.0, 2.0])
    for _ in range(1000):                       # a whole "program" on small constants
        y = (y * 0.5).abs()
    y.persist_op("y")
    ir = from_graph(graph)
    pair = node_seconds(ir.nodes[y.id], ir.nodes) + node_seconds(ir.nodes[y.id - 1], ir.nodes)  # abs, mul
    folded_ir, folded = fold_constants(ir, budget_seconds=100.5 * pair)
    assert folded == 200                        # the earliest 100 steps, then the budget is spent
    computed = [n.id for n in folded_ir.nodes.values() if n.op != "const"]
    assert len(computed) == 1800 and min(computed) > max(folded_ir.constants)
    assert fold_constants(ir, budget_seconds=0)[1] == 0


def test_folding_a_multi_output_op_folds_its_outputs(graph):
    top, bottom = R.split(R.t([[1.0, 2.0], [3.0, 4.0]]), 2, axis=0)
    top.persist_op("t")
    bottom.persist_op("b")
    compiled = compile_graph(graph)
    assert compiled.summary["folded"] == 2      # both tuple_gets; the split itself is then dead
    assert len(compiled.plan.subgraphs) == 0 and compiled.summary["dead_code_removed"] == 2
    torch.testing.assert_close(compiled.constants[bottom.id], torch.tensor([[3.0, 4.0]]))
    assert compiled.plan.persisted["b"] == bottom.id and bottom.id in compiled.plan.constants


# ------------------------------------------------------------------------------------------------ fusion

def test_fusion_links_single_reader_chains_only(graph):
    x = big(10, 1000)
    a = x.exp()
    b = a.neg()                  # a -> b: a has one reader, b one computed input
    c = b.square()               # b -> c
    d = c + a.sum()              # two computed inputs: starts no link... and a now has two readers
    e = d.abs()                  # d -> e
    f, g = e.exp(), e.neg()      # e has two readers: neither link
    (f + g).persist_op("out")
    chained, chains = fuse_linear_chains(from_graph(graph))
    assert chained == {c.id: b.id, e.id: d.id}
    assert chains == 2
    chained, chains = fuse_linear_chains(from_graph(R.Graph(name="chain")))
    assert chains == 0 and chained == {}


def test_fusion_ignores_constant_inputs_when_looking_for_a_chain(graph):
    x = big(10, 1000)
    a = x * 2.0
    b = a + R.t([1.0])           # constants do not break a chain
    b.persist_op("b")
    chained, chains = fuse_linear_chains(from_graph(graph))
    assert chained == {b.id: a.id} and chains == 1


# -------------------------------------------------------------------------------------------- pipeline

def test_pipeline_counts_every_pass(graph):
    x = big(10, 1000)
    y = x.exp() + x.exp()
    x.neg()
    (R.t([1.0]) + 2.0).persist_op("folded")
    y.square().persist_op("y")
    ir, counts = run_pipeline(from_graph(graph))
    assert counts == {"dead_code_removed": 3, "cse_merged": 1, "steps_folded": 0, "folded": 1}
    summary = compile_graph(graph).summary   # fusion, after the passes, marks the one chain left: exp -> square
    assert {k: summary[k] for k in counts} == counts and summary["fused_chains"] == 1


def _drops_outputs(ir):
    return ir.replace(nodes={id: n for id, n in ir.nodes.items() if id not in ir.outputs.values()}), 1


def _reads_the_future(ir):
    nodes = dict(ir.nodes)
    first, last = min(nodes), max(nodes)
    nodes[first] = nodes[first].with_inputs((last,))
    return ir.replace(nodes=nodes), 1


@pytest.mark.parametrize("broken, message", [(_drops_outputs, "persisted output 'y'"),
                                             (_reads_the_future, "not defined before it")])
def test_invariant_checker_names_the_pass_that_broke_the_ir(graph, broken, message):
    big(10, 1000).exp().persist_op("y")
    with pytest.raises(InvariantError, match=rf"{broken.__name__} broke an invariant: .*{message}"):
        run_pipeline(from_graph(graph), passes=PIPELINE[:2] + (("broken", broken),) + PIPELINE[2:])


def _breaks_a_loop_template(ir):
    """A new loop record (as a pass that changes a loop makes one) whose step reads a value never defined."""
    loops = {}
    for id, record in ir.loops.items():
        first, *rest = record.spec.templates
        broken = replace(first, nodes=[first.nodes[0].with_inputs((10**6,))] + first.nodes[1:])
        loops[id] = LoopRecord(replace(record.spec, templates=[broken, *rest]), record.names)
    return ir.replace(loops=loops), 1


def test_invariant_checker_looks_again_at_a_loop_a_pass_rewrote(graph):
    loop = Loop([R.t([1.0, 2.0])])
    with loop.step() as step:
        step.carry([step.carried[0] * 2.0])
    loop.run([(0, 3)])[0].persist_op("w")
    passes = PIPELINE[:1] + (("keeps the loop", lambda ir: (ir.replace(nodes=dict(ir.nodes)), 0)),)
    run_pipeline(from_graph(graph), passes=passes)   # the same record after a pass: valid as it was
    with pytest.raises(InvariantError, match=r"_breaks_a_loop_template broke an invariant: loop \d+, step 0: node "
                                             r"\d+ \(\w+\) reads 1000000"):
        run_pipeline(from_graph(graph), passes=passes + (("broken", _breaks_a_loop_template),))


def test_invariants_catch_a_lost_constant(graph):
    x = big(10, 1000)
    y = x.exp().neg()
    y.persist_op("y")
    ir = from_graph(graph)
    with pytest.raises(ValueError, match=f"const node {x.id} has no value"):
        check_invariants(ir.replace(constants={}))


def test_compiling_never_mutates_the_graph(graph):
    a = R.t([1.0, 2.0])
    c = (a + 1.0).exp()
    c.persist_op("c")
    before = [(n.id, n.op, tuple(i.id for i in n.inputs)) for n in graph.nodes]
    constants = dict(graph.constants)
    compiled = compile_graph(graph)
    assert compiled.summary["folded"] == 2
    assert [(n.id, n.op, tuple(i.id for i in n.inputs)) for n in graph.nodes] == before
    assert graph.constants == constants and c.id not in graph.constants
