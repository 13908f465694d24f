"""The partitioner and the plan: an acyclic quotient graph, every op in exactly one subgraph, independent
heavy branches apart, chains of tiny ops kept together, bounded runs, and a plan that computes what the
recorded graph computes."""
import networkx as nx
import pytest
import torch

from compiler import compile_graph
from compiler.cost import DEVICES, DeviceModel
import compiler.partition as partition_module
import ravop as R
from ravop.runtime.evaluate import evaluate, run_nodes
from ravop.wire import plan_pb2, unpack_nodes



# These graphs repeat small steps on purpose, to test partitioning; folding them into loops would leave the
# partitioner nothing to do.
pytestmark = pytest.mark.usefixtures("no_loop_folding")


def run_plan(compiled):
    """Run the plan as workers would: a subgraph runs once its predecessors are done and sees only the
    tensors its `inputs` name. Returns persist name -> tensor."""
    plan = compiled.plan
    store = {i: compiled.constants[i] for i in plan.constants}
    subgraphs = {sub.id: sub for sub in plan.subgraphs}
    waiting = {sub.id: sub.n_predecessors for sub in plan.subgraphs}
    ready = [i for i, n in waiting.items() if n == 0]
    ran = 0
    with torch.no_grad():
        while ready:
            sub = subgraphs[ready.pop()]
            env = run_nodes(unpack_nodes(sub.nodes), {i: store[i] for i in sub.inputs}, plan.seed)
            store.update({i: env[i] for i in sub.outputs})
            ran += 1
            for s in sub.successors:
                waiting[s] -= 1
                if waiting[s] == 0:
                    ready.append(s)
    assert ran == len(plan.subgraphs), "some subgraphs never became ready"
    return {name: store[i] for name, i in plan.persisted.items()}


def check_plan(plan):
    """The structural promises of a plan; returns the quotient graph."""
    owner = {}
    for sub in plan.subgraphs:
        for node in unpack_nodes(sub.nodes):
            assert node.id not in owner, f"node {node.id} is in two subgraphs"
            owner[node.id] = sub.id
    assert len(owner) == plan.n_compiled_ops
    constants = set(plan.constants)
    assert not constants & set(owner)
    quotient = nx.DiGraph()
    quotient.add_nodes_from(sub.id for sub in plan.subgraphs)
    multi = set()
    for sub in plan.subgraphs:
        defined = set()
        for node in unpack_nodes(sub.nodes):
            for i in node.inputs:
                assert i in defined or i in sub.inputs, f"node {node.id} reads {i}, not defined in its subgraph"
            if node.op == "tuple_get":
                assert node.inputs[0] in defined, "a tuple_get is apart from its multi-output node"
            if node.dtype is None:
                multi.add(node.id)
            defined.add(node.id)
        for i in sub.inputs:
            assert i in constants or sub.id in plan.subgraphs[owner[i]].successors
            assert i in constants or i in plan.subgraphs[owner[i]].outputs
        assert set(sub.outputs) <= defined and not set(sub.outputs) & multi
        for s in sub.successors:
            assert s > sub.id  # windows of a topological order: edges only go forward
            quotient.add_edge(sub.id, s)
    for sub in plan.subgraphs:
        assert sub.n_predecessors == quotient.in_degree(sub.id)
    assert nx.is_directed_acyclic_graph(quotient)
    for name, i in plan.persisted.items():
        assert i in constants or i in plan.subgraphs[owner[i]].outputs, f"persisted {name!r} is not stored"
    return quotient, owner


def estimated_seconds(sub, device="cpu"):
    """The cost model's estimate for a whole subgraph, from the plan's totals."""
    model = DEVICES[device]
    computed = [n for n in unpack_nodes(sub.nodes) if n.op != "tuple_get"]
    tensors = sum(len(n.inputs) + 1 for n in computed)  # single-output ops in the tests that use this
    return (len(computed) - 1) * model.op_s + model.seconds(tensors, sub.flops, sub.bytes)


def mixed_program():
    """Random ops, multi-output ops, foldable constants, duplicates, reductions and matmuls."""
    g = R.Graph(name="mixed", seed=3)
    x = R.t(torch.linspace(-1, 1, 6000).reshape(60, 100))
    w = R.random_uniform(-0.1, 0.1, size=(100, 20))
    h = (x @ w).exp() + (x @ w).exp()
    top, bottom = R.split(h, 2, axis=0)
    values, indices = R.sort(bottom, axis=1, return_indices=True)
    scale = (R.t([2.0, 3.0]) * 4.0).sum()                      # folded
    y = (top - values) * scale + R.dropout(h, p=0.3)[:30]
    y.sum(axis=1).persist_op("row_sums")
    indices.persist_op("indices")
    R.mean(R.square(y)).persist_op("loss")
    R.random(size=(5,)).persist_op("noise")
    x.persist_op("x")                                          # a persisted constant
    return g


@pytest.mark.parametrize("bounds", [dict(), dict(min_subgraph_seconds=0, max_subgraph_seconds=0)])
def test_plan_computes_what_the_graph_computes(bounds):
    g = mixed_program()
    compiled = compile_graph(g, **bounds)
    check_plan(compiled.plan)
    if bounds:  # every op alone (but tuple_gets with their node): the worst case for the plumbing
        tuple_gets = sum(n.op == "tuple_get" for sub in compiled.plan.subgraphs
                         for n in unpack_nodes(sub.nodes))
        assert tuple_gets == 4 and len(compiled.plan.subgraphs) == compiled.plan.n_compiled_ops - tuple_gets
    got = run_plan(compiled)
    names = list(g.persisted)
    want = evaluate([g.persisted[n] for n in names])
    for name, value in zip(names, want):
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_negative_seeds_and_names_sharing_one_value_survive_the_plan():
    g = R.Graph(name="seeds", seed=-5)
    x = R.random(size=(3000,)) * 2.0
    (R.random(size=(3000,)) * 2.0).persist_op("other")   # same op and params: drawn separately, not merged
    x.exp().persist_op("a")
    x.exp().persist_op("b")                              # merged by CSE: two names, one node
    compiled = compile_graph(g)
    assert compiled.plan.seed == 2 ** 64 - 5 and compiled.plan.persisted["a"] == compiled.plan.persisted["b"]
    got = run_plan(compiled)
    want = evaluate([g.persisted[n] for n in ("a", "b", "other")])
    for name, value in zip(("a", "b", "other"), want):
        torch.testing.assert_close(got[name], value, rtol=0, atol=0)
    assert not torch.equal(got["a"], got["other"].exp())


def test_a_program_on_small_constants_is_folded_only_in_part_and_still_right():
    g = R.Graph(name="small constants")
    y = R.t([[1.0, 2.0], [3.0, 4.0]])
    for step in range(500):
        y = (y @ R.t([[0.5, 0.1], [0.2, 0.6]])).tanh() + 0.01
        if step % 100 == 0:
            y.sum().persist_op(f"s{step}")
    y.persist_op("y")
    compiled = compile_graph(g)
    check_plan(compiled.plan)
    assert 0 < compiled.summary["folded"] < 300 and compiled.summary["compiled_ops"] > 1000
    got = run_plan(compiled)
    for name, value in zip(g.persisted, evaluate(list(g.persisted.values()))):
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)


def heavy(n=512, seed=0):
    return R.t(torch.randn(n, n, generator=torch.Generator().manual_seed(seed)) / n ** 0.5)


def test_independent_heavy_branches_land_in_different_subgraphs():
    R.Graph(name="branches")
    x, w1, w2 = heavy(seed=1), heavy(seed=2), heavy(seed=3)
    a = ((x @ w1).exp() @ w1).abs()
    b = ((x @ w2).exp() @ w2).abs()
    (a + b).sum().persist_op("out")
    plan = compile_graph(R.current_graph()).plan
    quotient, owner = check_plan(plan)
    assert owner[a.id] != owner[b.id]
    assert not nx.has_path(quotient, owner[a.id], owner[b.id]) and not nx.has_path(quotient, owner[b.id], owner[a.id])
    assert plan.max_parallel_width >= 2


def test_heavy_branches_forking_from_one_value_do_not_wait_for_each_other():
    R.Graph(name="fork")
    h = (heavy(seed=1) @ heavy(seed=2)).tanh()
    a = (h @ heavy(seed=3)).exp()
    b = (h @ heavy(seed=4)).exp()
    a.persist_op("a")
    b.persist_op("b")
    quotient, owner = check_plan(compile_graph(R.current_graph()).plan)
    assert owner[a.id] != owner[b.id] and owner[h.id] not in (owner[a.id], owner[b.id])
    assert not nx.has_path(quotient, owner[a.id], owner[b.id]) and not nx.has_path(quotient, owner[b.id], owner[a.id])


def test_a_long_chain_of_tiny_ops_is_not_one_subgraph_per_op():
    R.Graph(name="tiny chain")
    x = R.t(torch.rand(5000))                # just above the folding limit
    y = x
    for _ in range(500):
        y = (y * 0.999 + 0.001).abs()
    y.persist_op("y")
    compiled = compile_graph(R.current_graph())
    check_plan(compiled.plan)
    assert compiled.summary["compiled_ops"] == 1500
    assert len(compiled.plan.subgraphs) == 1  # one fused chain, well under the time bound


def test_tiny_branchy_ops_are_grouped_to_the_minimum_work_per_subgraph():
    R.Graph(name="tiny branches")
    y = R.t(torch.rand(5000))
    for _ in range(1000):
        y = y + y.exp() * 0.001              # y has two readers: no chain to keep, a cut is allowed anywhere
    y.persist_op("y")
    compiled = compile_graph(R.current_graph(), min_subgraph_seconds=0.004)
    check_plan(compiled.plan)
    subs = compiled.plan.subgraphs
    total = sum(estimated_seconds(s) for s in subs)
    assert 2 <= len(subs) <= total / 0.004 + 1
    assert all(estimated_seconds(s) >= 0.004 for s in subs[:-1])


def test_a_long_loop_is_cut_into_bounded_runs_and_early_results_come_early():
    R.Graph(name="loop")
    w = heavy(256, seed=1)
    x = heavy(256, seed=2)
    losses = []
    for step in range(40):
        x = (x @ w).tanh()
        losses.append(x.mean())
        losses[-1].persist_op(f"loss_{step}")
    x.persist_op("x")
    plan = compile_graph(R.current_graph(), min_subgraph_seconds=0.001, max_subgraph_seconds=0.01).plan
    quotient, owner = check_plan(plan)
    assert len(plan.subgraphs) >= 4
    for sub in plan.subgraphs:
        assert len(sub.nodes.id) == 1 or estimated_seconds(sub) <= 0.01
    assert owner[losses[0].id] < owner[losses[-1].id]
    assert not nx.has_path(quotient, owner[losses[-1].id], owner[losses[0].id])


def test_a_multi_output_node_stays_with_its_tuple_gets_even_when_every_op_is_cut():
    R.Graph(name="multi")
    x = R.t(torch.rand(100, 100))
    parts = R.split(x.exp(), 4, axis=0)
    for k, part in enumerate(parts):
        part.sum().persist_op(f"p{k}")
    plan = compile_graph(R.current_graph(), min_subgraph_seconds=0, max_subgraph_seconds=0).plan
    quotient, owner = check_plan(plan)
    split = parts[0].inputs[0]
    assert {owner[p.id] for p in parts} == {owner[split.id]}
    assert split.id not in plan.subgraphs[owner[split.id]].outputs
    assert set(plan.subgraphs[owner[split.id]].outputs) == {p.id for p in parts}


def test_persisted_ids_are_outputs_and_the_plan_carries_graph_facts():
    g = R.Graph(name="facts", gpu_required="yes", seed=11)
    x = R.t(torch.rand(100, 100))
    y = x.exp()
    z = y.sum()
    y.persist_op("y")
    z.persist_op("z")
    compiled = compile_graph(g)
    plan = compiled.plan
    check_plan(plan)
    assert plan.graph_id == g.id and plan.seed == 11 and plan.n_recorded_ops == 3
    assert dict(plan.persisted) == {"y": y.id, "z": z.id}
    assert all(sub.device == "cuda" for sub in plan.subgraphs)
    (sub,) = plan.subgraphs
    assert list(sub.outputs) == [y.id, z.id] and list(sub.inputs) == [x.id]
    assert list(plan.constants) == [x.id] and set(compiled.constants) == {x.id}
    assert plan.flops == 2 * 100 * 100 and compiled.summary["subgraphs"] == 1
    assert plan_pb2.Plan.FromString(plan.SerializeToString()) == plan


def test_cost_model_estimates_matmul_and_conv_from_shapes():
    from compiler.cost import node_flops
    from compiler.ir import from_graph
    g = R.Graph(name="costs")
    mm = R.matmul(R.t(torch.rand(8, 30, 40)), R.t(torch.rand(40, 50)))
    lin = R.linear(R.t(torch.rand(16, 40)), R.t(torch.rand(50, 40)))
    conv = R.conv2d(R.t(torch.rand(2, 6, 10, 10)), R.t(torch.rand(12, 3, 3, 3)), padding=1, groups=2)
    ew = R.exp(R.t(torch.rand(7, 9)))
    nodes = from_graph(g).nodes
    assert node_flops(nodes[mm.id], nodes) == 2 * 8 * 30 * 50 * 40
    assert node_flops(nodes[lin.id], nodes) == 2 * 16 * 50 * 40
    assert node_flops(nodes[conv.id], nodes) == 2 * (2 * 12 * 10 * 10) * 3 * 3 * 3
    assert node_flops(nodes[ew.id], nodes) == 63


def test_an_opdef_flops_rule_overrides_the_default(monkeypatch):
    from compiler.cost import node_flops
    from compiler.ir import from_graph
    from ravop.core import registry
    g = R.Graph(name="flops rule")
    y = R.t(torch.rand(7, 9)).exp()
    seen = []
    monkeypatch.setattr(registry.get("exp"), "flops", lambda shape, ins, params: seen.append((shape, ins)) or 5e9)
    nodes = from_graph(g).nodes
    assert node_flops(nodes[y.id], nodes) == 5e9 and seen == [((7, 9), [(7, 9)])]


def test_a_torchscript_models_flops_are_counted_when_recorded_not_carried_by_the_op():
    from compiler.cost import node_flops
    from compiler.ir import from_graph
    g = R.Graph(name="torchscript flops")
    model = R.model(torch.nn.Linear(40, 50))
    weight, bias = R.t(model.params[0]), R.t(model.params[1])
    y, _ = model.forward([weight, bias], [], [R.t(torch.rand(16, 40))])
    R.grad(R.sum(y), [weight])
    nodes = from_graph(g).nodes
    forward = next(n for n in nodes.values() if n.op == "torchscript_forward")
    backward = next(n for n in nodes.values() if n.op == "torchscript_vjp")
    assert "flops" not in forward.params and "flops" not in backward.params   # nothing unused goes to a worker
    assert node_flops(forward, nodes) == 2 * 16 * 40 * 50   # torch's FlopCounterMode, on the requester
    assert node_flops(backward, nodes) == 3 * 2 * 16 * 40 * 50


def test_a_graph_with_nothing_persisted_compiles_to_an_empty_plan():
    R.Graph(name="empty")
    R.t([1.0, 2.0]).exp()
    compiled = compile_graph(R.current_graph())
    assert len(compiled.plan.subgraphs) == 0 and compiled.constants == {} and list(compiled.plan.constants) == []
    assert compiled.summary["max_parallel_width"] == 0 and compiled.summary["recorded_ops"] == 2


def test_the_quotient_check_catches_a_cycle():
    from compiler import InvariantError
    from compiler.partition import coarse_graph, max_parallel_width
    assert max_parallel_width(coarse_graph([[1], [2], [3], [4]], [(0, 1), (0, 2), (2, 3)])) == 2
    with pytest.raises(InvariantError, match="cycle"):
        coarse_graph([[1], [2], [3]], [(0, 1), (1, 2), (2, 0)])


def test_bad_bounds_are_rejected():
    R.Graph(name="bounds")
    with pytest.raises(ValueError, match="min_subgraph_seconds"):
        compile_graph(R.current_graph(), min_subgraph_seconds=1.0, max_subgraph_seconds=0.1)


def test_a_loop_is_cut_only_where_the_work_pays_for_handing_off_its_state():
    """Each cut stores the loop's state (4 MB here) in Redis for the next subgraph: the windows grow until
    their work dwarfs that transfer, instead of closing at every `min_subgraph_seconds` of work."""
    R.Graph(name="loop")
    state = R.t(torch.zeros(1_000_000))
    for _ in range(200):
        state = state * 0.99 + state.mean()    # the join breaks the chain: a cut is possible at every step
    state.persist_op("state")
    costed = compile_graph(R.current_graph()).plan
    check_plan(costed)
    for sub in costed.subgraphs[:-1]:
        handoff = 4e6 / DEVICES["cpu"].handoff_bytes_per_s
        assert estimated_seconds(sub) * partition_module.HANDOFF_SHARE >= handoff
    cpu = DEVICES["cpu"]
    free_handoffs = DeviceModel(cpu.op_s, cpu.tensor_s, cpu.flops_per_s, cpu.bytes_per_s, float("inf"))  # old rule
    free = compile_graph(R.current_graph(), devices={"cpu": free_handoffs}).plan
    assert 1 < len(costed.subgraphs) and len(costed.subgraphs) * 5 <= len(free.subgraphs)


def test_a_branch_is_not_split_off_when_moving_its_input_costs_more_than_it_saves():
    R.Graph(name="cheap branches")
    big = (R.t(torch.ones(2000, 2000)) * 2.0).exp()          # 16 MB made in the first window
    a = (big.tanh() * 3.0).sum()                             # cheap next to moving `big` to another worker
    b = (big.sigmoid() * 3.0).sum()
    (a + b).persist_op("out")
    plan = compile_graph(R.current_graph()).plan
    _, owner = check_plan(plan)
    assert owner[big.id] == owner[a.id] == owner[b.id]
