"""Recording is a function of the script (issue 41): a fit under a strategy that leaves `resident` open records
both of its forms (ravop/record/forms.py) and the session picks one at activation, so a script recorded with no
server at all gives the same graph, and the same plan for the same choice, as one recorded beside a live
cluster; and the compiler records nothing (a hand-written loop's replicas are recorded by the session from
`compiler.folded_loops`, then spliced)."""
import hashlib
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import ravop as R
from compiler import compile_graph, folded_loops
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.parallel.hand_written import record_replica_loops
from ravop.record import graph as recording
from ravop.record.forms import RESIDENT, SEGMENTS, Forms
from test_strategy_loops import hand_written_loop

TESTS = pathlib.Path(__file__).resolve().parent
RNG = np.random.default_rng(3)
X = RNG.normal(size=(48, 4)).astype(np.float32)
Y = RNG.normal(size=(48, 2)).astype(np.float32)


def mlp():
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(8, input_shape=(4,)), Activation("relu"), Dense(2)):
        model.add(layer)
    return model


STRATEGIES = {"replicas": lambda resident=None: R.parallel.DiLoCo(2, 2, resident=resident),
              "stages": lambda resident=None: R.parallel.Pipeline(2, micro_batches=2, resident=resident)}


def record_script(strategy):
    """A user's script: a fit under a strategy that leaves `resident` to the cluster (the default)."""
    graph = R.Graph(name=f"pure {strategy}", seed=7)
    model = mlp()
    model.fit(X, Y, n_epochs=2, batch_size=6, strategy=STRATEGIES[strategy]())
    model.persist_weights()
    return graph


def digests(graph):
    """(the recorded graph's digest, the digest of its plan with every part's resident form chosen)."""
    table = hashlib.sha256()
    for op in graph.nodes:
        table.update(repr((op.op, [i.id for i in op.inputs], op.params, op.shape, op.dtype, op.source)).encode())
    for id, tensor in sorted(graph.constants.items()):
        table.update(f"{id}:{tensor.dtype}:{tuple(tensor.shape)}".encode() + tensor.numpy().tobytes())
    table.update(repr(sorted((name, op.id) for name, op in graph.persisted.items())).encode())
    table.update(repr([(part.what, [(name, f.start, f.stop, f.results) for name, f in part.forms.items()])
                       for part in graph.strategy_notes.forms]).encode())
    plan = compile_graph(graph, forms=[RESIDENT] * len(graph.strategy_notes.forms)).plan
    plan.ClearField("graph_id")   # a graph's id is random; everything else follows from the script
    return table.hexdigest(), hashlib.sha256(plan.SerializeToString(deterministic=True)).hexdigest()


def test_a_script_records_the_same_graph_and_plan_with_no_server_and_beside_a_cluster(engine, workers):
    # this process's import path (pyproject's pythonpath: the checkout first, then tests/ and its folders; tests/
    # holds folders named as the packages, tests/compiler and tests/worker, found as namespace packages otherwise)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    alone = subprocess.run([sys.executable, "-c", "import test_recording_is_pure as t\n"
                            "for s in t.STRATEGIES: print(*t.digests(t.record_script(s)))"],
                           cwd=TESTS, env=env, capture_output=True, text=True, timeout=600)
    assert alone.returncode == 0, alone.stderr
    workers.start(2)   # enough for the resident forms: two replicas, two stages
    for strategy, printed in zip(STRATEGIES, alone.stdout.splitlines()):
        graph = record_script(strategy)
        assert " ".join(digests(graph)) == printed, strategy
        assert [list(part.forms) for part in graph.strategy_notes.forms] == [[RESIDENT, SEGMENTS]]
        summary = R.activate()   # the session decides, from the live workers
        assert list(summary["forms"].values()) == [RESIDENT], summary["forms"]


def test_the_choice_is_the_first_form_only_where_the_live_workers_hold_it():
    part = Forms("DiLoCo's replicas", workers=3, forms=dict.fromkeys([RESIDENT, SEGMENTS]))
    assert [part.choose(n) for n in (0, 2, 3, 8)] == [SEGMENTS, SEGMENTS, RESIDENT, RESIDENT]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_chosen_form_is_compiled_as_if_recorded_alone(strategy):
    """Resident or segments chosen, the plan is the one that form recorded on its own gives (its summary and each
    subgraph's ops: the ids after the fit differ, by the other form's ops); no choice compiles the last form."""
    graph = record_script(strategy)
    for form, resident in ((RESIDENT, True), (SEGMENTS, False)):
        R.Graph(name=f"{form} alone", seed=7)
        model = mlp()
        model.fit(X, Y, n_epochs=2, batch_size=6, strategy=STRATEGIES[strategy](resident))
        model.persist_weights()
        chosen, alone = compile_graph(graph, forms=[form]), compile_graph(R.current_graph())
        assert {**chosen.summary, "recorded_ops": 0} == {**alone.summary, "recorded_ops": 0}, form
        assert _ops(chosen.plan) == _ops(alone.plan), form
    assert compile_graph(graph).summary == compile_graph(graph, forms=[SEGMENTS]).summary
    with pytest.raises(ValueError, match="not 'fast'"):
        compile_graph(graph, forms=["fast"])
    with pytest.raises(ValueError, match="1 parts"):
        compile_graph(graph, forms=[])


def _ops(plan):
    from ravop.wire import unpack_nodes
    return [([n.op for n in unpack_nodes(s.nodes)], [len(t.nodes.id) for t in s.loop.templates])
            for s in plan.subgraphs]


def _recording_calls(run):
    """The calls of the recorder (an op recorded, a graph made) while `run()` runs."""
    watched = {recording.record.__code__, recording.Graph.__init__.__code__, recording.Graph.add_node.__code__,
               recording.Graph.constant.__code__}
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in watched:
            calls.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_the_compiler_records_nothing():
    fits = record_script("replicas")
    hand = hand_written_loop(8, R.parallel.LocalSGD(2, sync_every=2))
    with pytest.raises(TypeError, match="hand-written loops"):
        compile_graph(hand)   # its replicas are recorded before, by the session
    loops = folded_loops(hand)
    assert len(loops) == 1 and loops[0].steps_per_replica == 3   # 8 steps: the first and last run once
    replicas = []
    assert _recording_calls(lambda: replicas.extend(record_replica_loops(hand.strategy, *loop, hand.seed)
                                                    for loop in loops))   # the detector sees a recording
    sizes = len(fits.nodes), len(hand.nodes)
    calls = _recording_calls(lambda: [compile_graph(fits, forms=[form]) for form in (RESIDENT, SEGMENTS)]
                             + [compile_graph(hand, replicas=replicas), folded_loops(hand)])
    assert calls == []
    assert (len(fits.nodes), len(hand.nodes)) == sizes
    assert compile_graph(hand, replicas=replicas).summary["loops_replicated"] == 1
