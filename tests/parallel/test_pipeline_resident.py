"""Resident pipeline stages (Pipeline(..., resident=True), ravdl/v2/pipeline_resident.py): one loop per stage for
the whole fit. Checked against the eager GPipe reference of tests/parallel/test_pipeline_any_model.py (same tolerances, with
BatchNorm and Dropout) and bit for bit against the segment recording, for Pytorch_Model and NeuralNetwork; the plan
does not grow with the steps; on a real server the stages run on workers with the in-process bits, a stage's worker
SIGKILLed mid-run is resumed with the same bits, and the bytes per step through the server are measured against
segments."""
import pytest
import torch

import ravop as R
import test_strategies_any_model as any_model
from compiler.compile import compile_graph
from helpers import on_one_thread
from ravop.client.placement import held_by
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import GraphKeys
from test_pipeline_any_model import (GRAPH_SEED, SHUFFLE_SEED, X, Y, bn_dropout_net, cut_of, engine_fit,
                                     gpipe_reference, ravdl_net, ravdl_stage, square_loss)
from test_resident_replicas import assert_same_as_in_process, mlp_fit, run_killing_a_replica, server_bytes

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def both_recordings(fit):
    """{resident: values} of `fit(resident)` (a graph and its persisted names) evaluated in-process."""
    out = {}
    for resident in (True, False):
        graph, names = fit(resident)
        out[resident] = evaluate_persisted(graph)
    return out, names


@pytest.mark.parametrize("stages, micro_batches", [(2, 3), (3, 2), (8, 1), (1, 2)])
def test_resident_pytorch_model_stages_equal_eager_gpipe_and_the_segments_bits(stages, micro_batches):
    batch_size, n_epochs = 12, 2
    values, names = both_recordings(lambda resident: engine_fit(
        bn_dropout_net, R.parallel.Pipeline(stages, micro_batches, resident=resident), n_epochs, batch_size))
    cuts = cut_of(bn_dropout_net(), stages, -(-batch_size // micro_batches))
    want, net = gpipe_reference(bn_dropout_net, cuts, n_epochs, batch_size, micro_batches, square_loss)
    assert len(names) == len(want) == n_epochs * len(X) // batch_size
    for name, loss in zip(names, want):
        assert abs(float(values[True][name]) - float(loss)) < 1e-5, name
    net.eval()
    with torch.no_grad():   # the running statistics: moved once per micro-batch, in order
        assert torch.allclose(values[True]["prediction"], net(torch.as_tensor(X)), atol=1e-5)
    for name in names + ["prediction"]:
        assert torch.equal(values[True][name], values[False][name]), name


def ravdl_fit(p, stages, micro_batches, resident):
    graph = R.Graph(name="resident pipeline ravdl", seed=GRAPH_SEED)
    model = ravdl_net(p)
    strategy = R.parallel.Pipeline(stages=stages, micro_batches=micro_batches, resident=resident)
    names = list(model.fit(X, Y, 2, 12, shuffle=True, seed=SHUFFLE_SEED, strategy=strategy))
    model.predict(X).persist_op("prediction")
    return graph, names, model, strategy


@pytest.mark.parametrize("p, stages, micro_batches", [(0.3, 8, 2), (0.3, 2, 3)])
def test_resident_neural_network_stages_equal_eager_gpipe_and_the_segments_bits(p, stages, micro_batches):
    values, names = both_recordings(lambda resident: ravdl_fit(p, stages, micro_batches, resident)[:2])
    _, _, model, strategy = ravdl_fit(p, stages, micro_batches, True)
    cuts = strategy.cut(model.pipeline_units(None, -(-12 // micro_batches)).memory)
    want, net = gpipe_reference(lambda: bn_dropout_net(p), cuts, 2, 12, micro_batches, square_loss, ravdl_stage)
    for name, loss in zip(names, want):
        assert abs(float(values[True][name]) - float(loss)) < 1e-5, name
    net.eval()
    with torch.no_grad():
        assert torch.allclose(values[True]["prediction"], net(torch.as_tensor(X)), atol=1e-5)
    for name in names + ["prediction"]:
        assert torch.equal(values[True][name], values[False][name]), name
    # BatchNorm's Python batch count moved as the segments move it: once per micro-batch and step
    tracked = [leaf.batches_tracked for leaf in model.layers if hasattr(leaf, "batches_tracked")]
    assert tracked == [2 * 4 * micro_batches]


def test_a_stage_loop_is_one_loop_for_the_whole_fit_with_its_own_templates():
    graph, _, _, _ = ravdl_fit(0.3, 2, 3, True)
    specs = [record.spec for record in graph.loops.values()]
    assert len(specs) == 2   # one loop per stage
    first, last = specs
    # stage 0: the training step, forward 0..2, backward 0..2, update; the last stage: training, forward 0..2, update
    assert len(first.sync_templates) == 7 and len(last.sync_templates) == 4 and first.sync_every == 1
    sends = [{s.channel for s in first.templates[t].sent} for t in first.sync_templates]
    assert sends[:3] == [{"pipe0.act.0.0"}, {"pipe0.act.0.1"}, {"pipe0.act.0.2"}] and not sends[-1]
    receives = [{r.channel for r in first.templates[t].received} for t in first.sync_templates]
    assert receives[3:6] == [{"pipe0.grad.0.0"}, {"pipe0.grad.0.1"}, {"pipe0.grad.0.2"}]
    # the forward's and the recompute's masks follow one shared stream (their own, named by the recorded seed)
    forward, backward = first.templates[first.sync_templates[0]], first.templates[first.sync_templates[3]]
    seeds = [{node.params["seed"] for node in template.nodes if node.id in {f.node for f in template.seed_followers}}
             for template in (forward, backward)]
    assert seeds[0] and seeds[0] == seeds[1]
    assert all(f.node == f.source for template in (forward, backward) for f in template.seed_followers)


@pytest.mark.parametrize("make_model", [pytest.param(any_model.pytorch_model, id="Pytorch_Model"),
                                        pytest.param(any_model.ChainedDense, id="Functional")])
def test_resident_stages_of_a_functional_and_a_pytorch_model_give_one_workers_mathematics(make_model):
    """Without BatchNorm and Dropout GPipe's micro-batches give one worker's training (as
    tests/parallel/test_strategies_any_model.py checks the segments)."""
    R.Graph(name="resident any model", seed=11)
    n_rows = 40   # batches of 8 divide them
    X_, Y_ = any_model.X[:n_rows], any_model.Y[:n_rows]
    model = make_model()
    graph = R.current_graph()
    names = list(model.fit(X_, Y_, 2, 8, loss="SquareLoss", strategy=R.parallel.Pipeline(3, 2, resident=True),
                           shuffle=True, seed=3))
    model._forward_pass(R.t(X_), training=False).persist_op("prediction")
    assert len(graph.loops) == 3
    values = evaluate_persisted(graph)
    net = any_model.torch_net()
    opt = torch.optim.Adam(net.parameters(), lr=any_model.LR)
    want = [any_model.adam_step(net, opt, torch.as_tensor(X_)[rows], torch.as_tensor(Y_)[rows])
            for rows in any_model.batches_of(n_rows, 8, 2, True, 3)]
    assert torch.allclose(torch.stack([values[n] for n in names]), torch.stack(want), atol=1e-5)
    assert torch.allclose(values["prediction"], net(torch.as_tensor(X_)).detach(), atol=1e-5)


def plan_size(n_epochs, resident):
    graph = R.Graph(name=f"pipeline plan {n_epochs}", seed=GRAPH_SEED)
    model = ravdl_net(0.3)
    model.fit(X, Y, n_epochs, 12, strategy=R.parallel.Pipeline(2, 2, resident=resident))
    model.persist_weights()
    plan = compile_graph(graph).plan
    nodes = sum(len(s.nodes.id) + sum(len(t.nodes.id) for t in s.loop.templates) for s in plan.subgraphs)
    plan.ClearField("persisted")   # the loss names: one per step
    return len(plan.subgraphs), nodes, plan.ByteSize()


def test_the_plan_does_not_grow_with_the_steps():
    few, many = plan_size(1, True), plan_size(6, True)
    print(f"resident plan (subgraphs, nodes, bytes): 4 steps {few}, 24 steps {many}")
    assert few[:2] == many[:2] and abs(few[2] - many[2]) <= 16   # varints only
    segments_few, segments_many = plan_size(1, False), plan_size(6, False)
    print(f"segments plan: 4 steps {segments_few}, 24 steps {segments_many}")
    assert segments_many[1] > 4 * segments_few[1]


def test_resident_knob_refusals_and_fallbacks():
    with pytest.raises(TypeError, match="resident"):
        R.parallel.Pipeline(2, resident="yes")
    assert "resident=True" in repr(R.parallel.Pipeline(2, resident=True))
    R.Graph(name="ragged", seed=1)
    with pytest.raises(ValueError, match="a batch_size of 10 leaves a short last batch of 8 of the 48 rows"):
        ravdl_net(0.0).fit(X, Y, 1, 10, strategy=R.parallel.Pipeline(2, 2, resident=True))
    R.Graph(name="replicas", seed=1)
    with pytest.raises(NotImplementedError, match="replicas > 1"):
        ravdl_net(0.0).fit(X, Y, 1, 12, strategy=R.parallel.Pipeline(2, 2, replicas=2, resident=True))
    graph = R.Graph(name="ragged default", seed=1)   # resident=None: segments where stages cannot be resident
    ravdl_net(0.0).fit(X, Y, 1, 10, strategy=R.parallel.Pipeline(2, 2))
    assert len(graph.loops) > 2


def test_bytes_per_step_resident_against_segments(engine, workers, client):
    """An MLP 784-256-10 (NeuralNetwork) in two stages of two micro-batches, batch 32, 512 rows."""
    # checkpoints off: this measures what the algorithm moves (a checkpoint is the fallback, priced apart)
    workers.start(2, extra=("--checkpoint-steps", "1000000", "--checkpoint-seconds", "100000"))
    per_step = {}
    for resident in (True, False):
        totals = []
        for n_epochs in (1, 3):
            before = server_bytes(client)
            n_params = mlp_fit(f"pipeline bytes {resident} {n_epochs}", 512, n_epochs,
                               R.parallel.Pipeline(2, 2, resident=resident))
            totals.append(server_bytes(client) - before)
        per_step[resident] = (totals[1] - totals[0]) / ((3 - 1) * 512 // 32)
        print(f"resident={resident}: {per_step[resident]:.0f} bytes per step through the server "
              f"({per_step[resident] / (4 * n_params):.2f}x the float32 parameters); run totals {totals}")
    # what crosses per step when resident: 2 micro-batches' activations (16 x 256 floats) and their gradients,
    # once in, once out, plus the exchange's polling; no parameters
    activations = 2 * 2 * 16 * 256 * 4
    assert per_step[True] < 4 * n_params   # less than one float32 model per step
    assert per_step[True] < per_step[False] / 5
    assert per_step[True] < 4 * activations


def test_resident_stages_run_on_two_workers_with_the_in_process_bits(engine, workers, client):
    names = workers.start(2)
    graph, persisted = engine_fit(bn_dropout_net, R.parallel.Pipeline(2, 2, resident=True), 2, 12)
    on_one_thread(R.activate)
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    keys = GraphKeys(engine.token, graph.id)
    ran = {client.hget(keys.ran, s).decode() for s in client.hkeys(keys.ran) if client.hget(keys.ran, s)}
    assert ran == set(names)
    (stages,) = held_by(graph).values()
    assert set(stages) == {"stage 0", "stage 1"} and all(len(w) == 1 for w in stages.values())
    assert_same_as_in_process(graph, persisted + ["prediction"])
    saved = R.fetch_persisting_op("trained")
    with torch.no_grad():
        assert torch.allclose(saved(torch.as_tensor(X)), R.fetch_persisting_op("prediction"), atol=1e-6)


def test_a_stage_whose_worker_is_killed_mid_run_resumes_elsewhere_with_the_same_bits(engine, workers, client):
    names = workers.start(3, reclaim_idle=1.0, extra=("--checkpoint-steps", "40"))
    graph, persisted = engine_fit(bn_dropout_net, R.parallel.Pipeline(2, 2, resident=True), 60, 12)
    keys, loop_id, holder = run_killing_a_replica(engine, workers, client, graph)
    assert client.hget(keys.ran, loop_id).decode() in set(names) - {holder}   # a spare took the stage over
    assert_same_as_in_process(graph, persisted + ["prediction"])


def _capabilities():
    """The ATen CPU capabilities to check besides this process's own: the baseline every CPU runs, and on x86 the
    AVX2 kernels an AVX2-only CPU (an AMD EPYC) runs."""
    import platform
    return ["default", "avx2"] if platform.machine() in ("x86_64", "AMD64") else ["default"]


@pytest.mark.parametrize("capability", _capabilities())
def test_resident_and_segment_bits_agree_under_every_cpu_capability(capability):
    """ATen picks its kernels by the CPU's instruction set (ATEN_CPU_CAPABILITY, read once per process): the
    bitwise comparisons above (resident against segments in-process, and the stages on two workers against the
    in-process bits) run again in a process, and its workers, that use `capability`'s kernels, so that an AVX512
    machine catches what an AVX2 one sees (issue 40: the first failed on an AMD EPYC, a micro-batch's GEMM rounded
    by its alignment, ravop/core/alignment.py)."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability,
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    check = ("import sys, torch, pytest; "
             f"assert torch.backends.cpu.get_cpu_capability() == {capability.upper()!r}, "
             "torch.backends.cpu.get_cpu_capability(); "
             "from ravop.local.embedded import worker_environment; "   # the workers it starts inherit it
             f"assert worker_environment()['ATEN_CPU_CAPABILITY'] == {capability!r}; "
             "sys.exit(pytest.main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", check, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-k", "segments_bits or in_process_bits", os.path.abspath(__file__)],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"under ATEN_CPU_CAPABILITY={capability}:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
