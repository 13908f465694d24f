"""The in-place contract (ravop/runtime/runner.py, `check_in_place`): a call list in which an in-place kernel
overwrites a value that a later call reads, that its caller did not copy in, that is handed out, or that it reads
twice, is refused with a `PlanError` before it runs; the loops' optimizer steps and the step compiler's groups keep
it."""
import pytest
import torch

from ravop.core import registry
from ravop.runtime import step_compiler
from ravop.core.errors import PlanError
from ravop.core.node import Node
from ravop.runtime.runner import Runner, check_in_place

ADAM = registry.REGISTRY["adam_step"]
PARAMS = {"step": 1, "lr": 0.1}


def adam_runner(extra_reader=False, n_params=1):
    """Holes 1.. (param, grad, exp_avg, exp_avg_sq, max) per parameter, an Adam step over each, its projections,
    and with `extra_reader` an op after the steps that reads the first param as it was before them."""
    nodes, inputs, outputs = [], [], []
    next_id = 100
    for p in range(n_params):
        holes = [10 * p + k for k in range(1, 6)]
        inputs += holes
        step = Node(next_id, "adam_step", holes, PARAMS, shape=((3,),) * 4, dtype=(torch.float32,) * 4)
        nodes.append(step)
        for k in range(4):
            nodes.append(Node(next_id + 1 + k, "tuple_get", [next_id], {"index": k}, shape=(3,), dtype=torch.float32))
            outputs.append(next_id + 1 + k)
        next_id += 10
    if extra_reader:
        nodes.append(Node(next_id, "neg", [1], shape=(3,), dtype=torch.float32))
        outputs.append(next_id)
    return Runner(nodes, inputs, outputs, free_inputs=False), inputs


def steps_in_place(runner):
    for index, node in enumerate(runner.nodes):
        if node.op == "adam_step":
            runner.replace(index, ADAM.in_place.kernel, ADAM.in_place.overwritten)


def owned(runner, inputs):
    return {runner.slot[i] for i in inputs}


def test_an_in_place_step_whose_values_nothing_reads_after_it_passes():
    runner, inputs = adam_runner(n_params=2)
    steps_in_place(runner)
    check_in_place(runner.calls, runner.overwrites, owned(runner, inputs), runner.kept, runner.nodes)
    assert sorted(runner.overwrites) == [0, 5]


def test_a_value_read_after_it_was_overwritten_is_refused():
    runner, inputs = adam_runner(extra_reader=True)
    steps_in_place(runner)
    with pytest.raises(PlanError, match=r"op 'neg' \(node 110\) reads value slot 0 after call 0 overwrote it"):
        check_in_place(runner.calls, runner.overwrites, owned(runner, inputs), runner.kept, runner.nodes)


def test_a_value_its_caller_did_not_copy_in_is_refused():
    runner, inputs = adam_runner()
    steps_in_place(runner)
    with pytest.raises(PlanError, match="op 'adam_step' .* did not copy in"):
        check_in_place(runner.calls, runner.overwrites, owned(runner, inputs) - {runner.slot[3]}, runner.kept,
                       runner.nodes)


def test_a_result_handed_out_is_refused():
    runner, inputs = adam_runner()
    steps_in_place(runner)
    with pytest.raises(PlanError, match="a result handed out"):
        check_in_place(runner.calls, runner.overwrites, owned(runner, inputs), runner.kept | {runner.slot[1]},
                       runner.nodes)


def test_a_value_overwritten_and_read_at_another_argument_is_refused():
    """One tensor as a step's param and its exp_avg (a merged constant): the update would read what it wrote."""
    nodes = [Node(100, "adam_step", [1, 2, 1, 3, 4], PARAMS, shape=((3,),) * 4, dtype=(torch.float32,) * 4)]
    runner = Runner(nodes, [1, 2, 3, 4], [100], free_inputs=False)
    runner.replace(0, ADAM.in_place.kernel, ADAM.in_place.overwritten)
    with pytest.raises(PlanError, match="overwrites value slot 0 in place, which call 0 overwrites too"):
        check_in_place(runner.calls, runner.overwrites, {0, 1, 2, 3}, runner.kept, runner.nodes)


def test_the_step_compilers_group_overwrites_what_its_members_did_and_keeps_the_contract():
    runner, inputs = adam_runner(n_params=3)
    steps_in_place(runner)
    compiled = step_compiler.compile_calls(runner)
    assert compiled.rewrites["optimizer_groups"] == 1
    assert list(compiled.overwrites) == [0]
    assert sorted(compiled.overwrites[0]) == sorted(s for slots in runner.overwrites.values() for s in slots)


def test_a_rewrite_that_breaks_the_contract_is_refused_and_the_step_runs_plain(monkeypatch):
    """A reader of the second param between the two steps: grouping both at the first would overwrite that param
    before it is read. With the step compiler's own guard (`_groupable`) switched off, the contract check refuses
    the rewritten list, and `tune` falls back to the plain step."""
    nodes = []
    for p, first_id in ((0, 100), (1, 200)):
        holes = [10 * p + k for k in range(1, 6)]
        nodes.append(Node(first_id, "adam_step", holes, PARAMS, shape=((3,),) * 4, dtype=(torch.float32,) * 4))
        nodes += [Node(first_id + 1 + k, "tuple_get", [first_id], {"index": k}, shape=(3,), dtype=torch.float32)
                  for k in range(4)]
        if p == 0:
            nodes.append(Node(150, "neg", [11], shape=(3,), dtype=torch.float32))   # the second param, before its step
    inputs = [10 * p + k for p in range(2) for k in range(1, 6)]
    outputs = [n.id for n in nodes if n.op != "adam_step"]
    runner = Runner(nodes, inputs, outputs, free_inputs=False)
    steps_in_place(runner)
    check_in_place(runner.calls, runner.overwrites, owned(runner, inputs), runner.kept, runner.nodes)
    assert step_compiler.compile_calls(runner).rewrites["optimizer_groups"] == 0   # the guard says no
    monkeypatch.setattr(step_compiler, "_groupable", lambda *args: True)
    with pytest.raises(PlanError, match=r"op 'neg' \(node 150\) reads value slot 5 after call 0 overwrote it"):
        step_compiler.compile_calls(runner)
    assert step_compiler.tune(runner, nodes, inputs, step_compiler.MemoryDecisions()) is None
