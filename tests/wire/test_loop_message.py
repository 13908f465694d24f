"""A loop step's records (`ravop.core.loop_template`: carried slots, row and run holes, outputs, seeded ops, seed
followers, received and sent values) and plan.proto's parallel lists, mapped by `ravop.wire.loop_message` alone:
the wire keeps its shape (a plan's loops come back byte for byte), and lists from the network that do not pair up
are refused by name."""
import pytest
import torch

import ravop as R
from compiler.compile import compile_graph
from ravop.client.graph_kinds import compile_planned
from ravop.core.errors import PlanError
from ravop.core.loop_template import CarriedSlot, LoopSpec, RunHole, StepOutput, StepTemplate
from ravop.core.node import Node
from ravop.wire import pack_loop, plan_pb2, unpack_loop
import test_loop_folding
import test_parallel_math
import test_pipeline_resident
import test_strategy_loops


def _diloco(**knobs):
    graph = R.Graph(name="diloco templates", seed=11)
    model = test_parallel_math.ravdl_net(test_parallel_math.torch_net())
    model.fit(test_parallel_math.X, test_parallel_math.Y, n_epochs=1, batch_size=6,
              strategy=R.parallel.DiLoCo(3, 2, resident=True, **knobs))
    return compile_graph(graph)


def _fit_with_dropout():
    graph = R.Graph(name="fit templates", seed=3)
    test_pipeline_resident.ravdl_net(0.3).fit(test_parallel_math.X, test_parallel_math.Y, 3, 7, shuffle=True, seed=5)
    return compile_graph(graph)


PLANS = {
    "a fit with dropout and a short shuffled batch": _fit_with_dropout,
    "a folded user loop": lambda: compile_graph(test_loop_folding.user_loop(3)),
    "DiLoCo over a hand-written loop": lambda: compile_planned(test_strategy_loops.hand_written_loop(
        8, R.parallel.DiLoCo(2, inner_steps=3, compression="int8", overlap=True))),
    "resident pipeline stages": lambda: compile_graph(test_pipeline_resident.ravdl_fit(0.3, 2, 3, True)[0]),
    "DiLoCo rounds that close without late replicas": lambda: _diloco(close_after=5.0),
}


def test_every_plan_loop_comes_back_byte_for_byte_and_together_they_use_every_template_field():
    used = set()
    for what, compile_plan in PLANS.items():
        loops = [sub.loop for sub in compile_plan().plan.subgraphs if sub.HasField("loop")]
        assert loops, what
        for loop in loops:
            again = plan_pb2.Loop()
            pack_loop(unpack_loop(loop), again)
            assert again.SerializeToString() == loop.SerializeToString(), what
            used |= {field.name for template in loop.templates for field, _ in template.ListFields()}
    assert used == set(plan_pb2.LoopTemplate.DESCRIPTOR.fields_by_name)


def _wire(**lists):
    """A plan_pb2.Loop of one template with `lists` set."""
    loop = plan_pb2.Loop(n_carried=1, outer_ids=[1, 2, 3], schedule=[0, 2], rounds=1, n_steps=2)
    template = loop.templates.add(carry_holes=[10], carry_next=[11])
    for name, values in lists.items():
        getattr(template, name)[:] = values
    return loop


def test_each_run_hole_reads_its_column_of_the_run_values_and_outputs_keep_their_tensor_ids():
    [template] = unpack_loop(_wire(run_holes=[20, 21], run_values=[1, 2, 3, 1], output_nodes=[11],
                                   output_first_ids=[100])).templates
    assert template.carried == [CarriedSlot(10, 11)]
    assert template.run_holes == [RunHole(20, (1, 3)), RunHole(21, (2, 1))]   # hole h at run r: [r * 2 + h]
    assert template.outputs == [StepOutput(11, 100)]


@pytest.mark.parametrize("lists, words", [
    ({"carry_next": []}, "carried holes and their next values"),
    ({"row_holes": [20]}, "row holes and their data"),
    ({"seeded_nodes": [11], "seed_strides": []}, "seeded ops and their strides"),
    ({"send_nodes": [11]}, "sent values and their channels"),
    ({"run_values": [1]}, "values per run but no holes"),
    ({"run_holes": [20, 21], "run_values": [1, 2, 3]}, "3 values per run do not fill its 2 holes"),
    ({"output_nodes": [11], "output_first_ids": [5, 6]}, "persisted values and their tensor ids"),
    ({"recv_holes": [20], "recv_channels": ["up"], "recv_optional": [True]}, "optional received values"),
])
def test_lists_from_the_network_that_do_not_pair_up_are_refused_by_name(lists, words):
    with pytest.raises(PlanError, match=words):
        unpack_loop(_wire(**lists))


def test_run_holes_that_cover_different_numbers_of_runs_cannot_be_packed():
    node = Node(11, "add", (10, 20), shape=(1,), dtype=torch.float32)
    template = StepTemplate([node], [CarriedSlot(10, 11)], run_holes=[RunHole(20, (1, 2)), RunHole(21, (3,))])
    with pytest.raises(ValueError, match="different numbers of runs"):
        pack_loop(LoopSpec([template], 1, [1, 2, 3], [(0, 2)], n_steps=2), plan_pb2.Loop())
