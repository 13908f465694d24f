"""Pipeline over any PyTorch model (Ravnest's `clusterize`): a Pytorch_Model is cut into stages of its top-level
children (ravop/record/torchscript_stages.py) and trained as GPipe (ravdl/v2/pipeline_fit.py). Checked against eager
PyTorch's GPipe-equivalent training (one model, each batch's micro-batches' weighted losses backpropagated in turn,
one optimizer step), with BatchNorm (running statistics once per micro-batch) and Dropout (the same masks: each
stage's forward draws from `stage_seed`, which the eager reference seeds too); a scripted model that is not a chain
of its children (a residual, a functional op between children, a tied parameter, a child called twice) is refused by
name (as nn.Modules they are cut on their graph: tests/parallel/test_pipeline_graph_cut.py); a stage that starts with an
in-place child trains; a traced module is cut as a scripted one; `stages='auto'` fits the workers' advertised memory
and bandwidth; on a real server two workers run the stages with the in-process bits."""
import warnings

import numpy as np
import pytest
import torch

from ravdl.v2 import NeuralNetwork, Pytorch_Model
from ravdl.v2.layers import Activation, BatchNormalization1D, Dense, Dropout
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.ops import torchscript
from ravop.ops.nn import _dropout_noise
from ravop.parallel.data_parallel import tensor_split
from ravop.parallel.pipeline import stage_seed
from ravop.record.torchscript_stages import NotAChain, chain_of
from ravop.runtime.evaluate import evaluate_persisted
from helpers import on_one_thread
from test_parallel_engine import assert_same_as_in_process, run_on_both

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

RNG = np.random.default_rng(5)
X = RNG.normal(size=(48, 5)).astype(np.float32)
LABELS = RNG.integers(0, 3, 48)
Y = np.eye(3, dtype=np.float32)[LABELS]
LR, GRAPH_SEED, SHUFFLE_SEED = 0.02, 11, 3


def bn_dropout_net(p=0.3):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(5, 8, bias=False), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                               torch.nn.Dropout(p), torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Dropout(p),
                               torch.nn.Linear(6, 3))


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(5, 5), torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.second(x + self.first(x))


class Flattening(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(5, 4), torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def cut_of(net, stages, micro_rows):
    """The stages' (start, stop) children the pipeline cuts `net` into (by the memory measured on a micro-batch)."""
    units = chain_of(R.model(net), torch.as_tensor(X[:micro_rows]))
    return R.parallel.Pipeline(stages).cut([unit.memory for unit in units])


def torch_stage(stage, x, seed_of):
    """A Pytorch_Model stage: TorchScript's dropout draws from the default generator, seeded with the stage's seed
    (`seed_of(0)`)."""
    torch.manual_seed(seed_of(0))
    return stage(x)


def ravdl_stage(stage, x, seed_of):
    """A NeuralNetwork stage: its k-th top-level Dropout multiplies by the mask drawn from `seed_of(k)`."""
    for k, child in enumerate(stage):
        if isinstance(child, torch.nn.Dropout):
            x = x * _dropout_noise(x, child.p, torch.Generator().manual_seed(seed_of(k)))
        else:
            x = child(x)
    return x


def gpipe_reference(make_net, cuts, n_epochs, batch_size, micro_batches, loss, run_stage=torch_stage):
    """(losses, net after training) of eager GPipe-equivalent training: per batch, each micro-batch's forward
    stage by stage (stage s of micro-batch m drawing its masks from `stage_seed`), its loss weighted by its share of
    the batch backpropagated, then one Adam step."""
    net = make_net()
    children = list(net.children())
    stages = [torch.nn.Sequential(*children[start:stop]) for start, stop in cuts]
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    rng = np.random.default_rng(SHUFFLE_SEED)
    orders = [rng.permutation(len(X)) for _ in range(n_epochs)]
    losses, index = [], 0
    net.train()
    for epoch in range(n_epochs):
        for start in range(0, len(X), batch_size):
            rows = orders[epoch][start:start + batch_size]
            opt.zero_grad()
            total = 0.0
            for m, (a, b) in enumerate(tensor_split(len(rows), micro_batches, "micro-batches")):
                x = torch.as_tensor(X[rows[a:b]])
                for s, stage in enumerate(stages):
                    x = run_stage(stage, x, lambda k, m=m, s=s: stage_seed(GRAPH_SEED, index, m, s, k))
                micro_loss = loss(x, rows[a:b]) * ((b - a) / len(rows))
                micro_loss.backward()
                total = total + micro_loss.detach()
            opt.step()
            losses.append(total)
            index += 1
    return losses, net


def square_loss(out, rows):
    return torch.nn.functional.mse_loss(out, torch.as_tensor(Y[rows]))


def engine_fit(make_net, strategy, n_epochs, batch_size):
    """(losses, model) of Pytorch_Model.fit under `strategy`, computed in-process, with the eval-mode prediction
    and the saved model persisted."""
    graph = R.Graph(name="pipeline any model", seed=GRAPH_SEED)
    model = Pytorch_Model(R.model(make_net()))
    model.initialize(Adam(lr=LR))
    names = list(model.fit(X, Y, n_epochs, batch_size, loss="SquareLoss", strategy=strategy, shuffle=True,
                           seed=SHUFFLE_SEED))
    model._forward_pass(R.t(X), training=False).persist_op("prediction")
    model.save_model("trained")
    return graph, names


@pytest.mark.parametrize("stages, micro_batches", [(2, 3), (3, 2), (8, 1)])
def test_pytorch_model_pipeline_equals_eager_gpipe_with_batchnorm_and_dropout(stages, micro_batches):
    batch_size, n_epochs = 12, 2
    strategy = R.parallel.Pipeline(stages=stages, micro_batches=micro_batches)
    graph, names = engine_fit(bn_dropout_net, strategy, n_epochs, batch_size)
    values = evaluate_persisted(graph)
    cuts = cut_of(bn_dropout_net(), stages, -(-batch_size // micro_batches))
    assert len(cuts) == stages
    want_losses, net = gpipe_reference(bn_dropout_net, cuts, n_epochs, batch_size, micro_batches, square_loss)
    assert len(names) == len(want_losses)
    for name, want in zip(names, want_losses):
        assert abs(float(values[name]) - float(want)) < 1e-5, name
    net.eval()
    with torch.no_grad():   # eval mode reads the running statistics: updated once per micro-batch, as torch
        assert torch.allclose(values["prediction"], net(torch.as_tensor(X)), atol=1e-5)


def test_dropout_masks_matter_and_p0_equals_plain_training():
    """With p=0 the pipeline is plain micro-batch accumulation; with p=0.3 a reference that draws other masks
    than the stages' seeds gives other losses (so the 1e-5 agreement above is the masks' doing)."""
    strategy = R.parallel.Pipeline(stages=2, micro_batches=2)
    graph, names = engine_fit(lambda: bn_dropout_net(0.0), strategy, 1, 12)
    values = evaluate_persisted(graph)
    cuts = [(0, 4), (4, 8)]   # any cut: without dropout the stages draw nothing
    want, _ = gpipe_reference(lambda: bn_dropout_net(0.0), cuts, 1, 12, 2, square_loss)
    assert all(abs(float(values[n]) - float(w)) < 1e-5 for n, w in zip(names, want))
    graph, names = engine_fit(bn_dropout_net, strategy, 1, 12)
    values = evaluate_persisted(graph)
    shifted, _ = gpipe_reference(bn_dropout_net, [(0, 8)], 1, 12, 2, square_loss)   # one seed for all children
    assert any(abs(float(values[n]) - float(w)) > 1e-3 for n, w in zip(names, shifted))


@pytest.mark.parametrize("module, what", [(Residual, "aten::add"), (Flattening, "aten::relu")])
def test_a_scripted_model_that_is_not_a_chain_of_its_children_is_refused_by_name(module, what):
    """Given as TorchScript, which torch.fx cannot trace (as nn.Modules they are cut on their graph:
    tests/parallel/test_pipeline_graph_cut.py)."""
    R.Graph(name="not a chain")
    with pytest.warns(DeprecationWarning, match="deprecates TorchScript"):
        model = Pytorch_Model(R.model(torch.jit.script(module())))
    model.initialize(Adam(lr=LR))
    with pytest.raises(NotAChain, match=f"the model {module.__name__} .* is not a chain of its children: its "
                                        f"forward runs {what} .* or give R.model the nn.Module itself"):
        model.fit(X, Y, 1, 8, loss="SquareLoss", strategy=R.parallel.Pipeline(stages=2))


def in_place_net():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(inplace=True), torch.nn.Linear(8, 6),
                               torch.nn.ReLU(inplace=True), torch.nn.Linear(6, 3))


def test_a_stage_that_starts_with_an_in_place_child_trains_as_eager():
    """Every cut of five children (one per stage) puts a ReLU(inplace=True) first in a stage: the stage clones its
    input, which its VJP differentiates as an autograd leaf."""
    graph, names = engine_fit(in_place_net, R.parallel.Pipeline(stages=5, micro_batches=2), 1, 12)
    values = evaluate_persisted(graph)
    want, _ = gpipe_reference(in_place_net, [(k, k + 1) for k in range(5)], 1, 12, 2, square_loss)
    assert all(abs(float(values[n]) - float(w)) < 1e-5 for n, w in zip(names, want))


def ravdl_net(p):
    """bn_dropout_net(p) as a NeuralNetwork, from its initial weights."""
    linear = [m for m in bn_dropout_net(p) if isinstance(m, torch.nn.Linear)]

    def weights(k):
        return linear[k].weight.detach().numpy()
    model = NeuralNetwork(Adam(lr=LR), loss="SquareLoss")
    for layer in (Dense(8, initial_W=weights(0), use_bias=False, input_shape=(5,)),
                  BatchNormalization1D(momentum=0.1, epsilon=1e-5), Activation("tanh"), Dropout(p),
                  Dense(6, initial_W=weights(1), initial_w0=linear[1].bias.detach().numpy()), Activation("relu"),
                  Dropout(p), Dense(3, initial_W=weights(2), initial_w0=linear[2].bias.detach().numpy())):
        model.add(layer)
    return model


@pytest.mark.parametrize("p, stages, micro_batches", [(0.3, 8, 2), (0.3, 2, 3), (0.0, 3, 2)])
def test_neural_network_pipeline_equals_eager_gpipe_with_batchnorm_and_dropout(p, stages, micro_batches):
    graph = R.Graph(name="pipeline ravdl", seed=GRAPH_SEED)
    model = ravdl_net(p)
    strategy = R.parallel.Pipeline(stages=stages, micro_batches=micro_batches)
    names = list(model.fit(X, Y, 2, 12, shuffle=True, seed=SHUFFLE_SEED, strategy=strategy))
    model.predict(X).persist_op("prediction")
    values = evaluate_persisted(graph)
    units = model.pipeline_units(None, -(-12 // micro_batches))
    cuts = strategy.cut(units.memory)
    want, net = gpipe_reference(lambda: bn_dropout_net(p), cuts, 2, 12, micro_batches, square_loss, ravdl_stage)
    for name, loss in zip(names, want):
        assert abs(float(values[name]) - float(loss)) < 1e-5, name
    net.eval()
    with torch.no_grad():
        assert torch.allclose(values["prediction"], net(torch.as_tensor(X)), atol=1e-5)


def worker(name, memory, speed):
    return {"name": name, "kind": "cpu", "memory_limit": memory, "handoff_bytes_per_s": speed, "threads": 1}


def test_auto_stages_fit_each_workers_memory_and_cut_where_the_least_crosses():
    auto = R.parallel.Pipeline(stages="auto", micro_batches=2)
    memory = [10, 10, 10, 10]
    one_big = auto.fit_to_workers(memory, [1, 1, 1, 1], [worker("a", 40, 1e6), worker("b", 40, 1e6)])
    assert (one_big.stages, one_big.cut(memory)) == (1, [(0, 4)])
    # two stages: of the cuts that fit, the one whose boundary moves the fewest bytes, not the most even one
    narrow = auto.fit_to_workers(memory, [30, 100, 1, 5], [worker("a", 30, 1e6), worker("b", 30, 1e6)])
    assert narrow.cut(memory) == [(0, 3), (3, 4)] and R.parallel.Pipeline(2).cut(memory) == [(0, 2), (2, 4)]
    # stage s is sized by the worker the forecast deals it: the fastest hand-off first
    uneven = auto.fit_to_workers(memory, [1, 1, 1, 1], [worker("slow", 12, 1e5), worker("fast", 35, 1e7)])
    assert uneven.cut(memory) == [(0, 3), (3, 4)]
    assert R.parallel.forecast(uneven, [worker("slow", 12, 1e5), worker("fast", 35, 1e7)], "cpu") == \
        {"stage 0": "fast", "stage 1": "slow"}
    with pytest.raises(ValueError, match="a unit needs about 50 bytes"):
        auto.fit_to_workers([50, 10], [1, 1], [worker("a", 40, 1e6)])


def test_pytorch_model_stages_run_on_two_workers_with_the_in_process_bits(engine, workers, client):
    names = workers.start(2)
    # segments: with two live workers resident=None would make the stages resident (tests/parallel/test_pipeline_resident.py)
    graph, persisted = engine_fit(bn_dropout_net, R.parallel.Pipeline(stages=2, micro_batches=2, resident=False), 2,
                                  12)
    # One thread: compiling folds the first micro-batch's stage 0 forward (it reads only constants), whose
    # BatchNorm statistics a multi-threaded reduction would sum in another order than the reference.
    assert "stage 1 on" in str(on_one_thread(R.activate))
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted + ["prediction"])
    saved = R.fetch_persisting_op("trained")
    with torch.no_grad():   # eval mode: the running statistics the stages updated
        assert torch.allclose(saved(torch.as_tensor(X)), R.fetch_persisting_op("prediction"), atol=1e-6)


def test_auto_stages_cut_a_pytorch_model_that_one_worker_cannot_hold(engine, workers, client):
    """Workers advertising 25 KB each: the model's parameters with their gradients and Adam's moments (about 39 KB)
    need two stages, which the workers run with the in-process bits."""
    def wide_net():
        torch.manual_seed(2)
        return torch.nn.Sequential(torch.nn.Linear(5, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    memory = [unit.memory for unit in chain_of(R.model(wide_net()), torch.as_tensor(X[:6]))]
    assert max(memory) < 25_000 < sum(memory)
    names = workers.start(2, extra=("--max-subgraph-bytes", str(25_000)))
    graph, persisted = engine_fit(wide_net, R.parallel.Pipeline(stages="auto", micro_batches=2), 1, 12)
    summary = str(on_one_thread(R.activate))
    assert "Pipeline(stages=2, micro_batches=2)" in summary and "stage 1 on" in summary
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted)


def test_a_torchscript_vjp_gives_the_same_bits_at_every_call():
    """TorchScript's profiling executor rewrites a graph after its first calls, and BatchNorm's backward then rounds
    otherwise; ravop runs modules unoptimised, so a worker's first call and its hundredth agree (a pipeline stage's
    recompute on a fresh worker gives the bits its forward's did elsewhere)."""
    model = R.model(bn_dropout_net(0.0))
    torchscript._modules.clear()
    xs = [model.blob, *model.params, *model.buffers, torch.as_tensor(X[:6]), torch.ones(6, 3)]
    params = dict(model_hash=model.model_hash, param_slots=model.param_slots, buffer_slots=model.buffer_slots,
                  n_args=1, kwarg_names=(), training=True, seed=0,
                  mask=(True,) * len(model.params) + (False,) * (len(model.buffers) + 1), grad_mask=(True,))
    first = torchscript.torchscript_vjp(*xs, **params)
    for _ in range(4):
        assert all(torch.equal(a, b) for a, b in zip(first, torchscript.torchscript_vjp(*xs, **params)))


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(5, 5), torch.nn.Linear(5, 5)
        self.second.weight = self.first.weight

    def forward(self, x):
        return self.second(self.first(x))


class Twice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(5, 5)

    def forward(self, x):
        return self.first(self.first(x))


@pytest.mark.parametrize("module, why", [(Tied, "ties parameter first.weight across children first and second"),
                                         (Twice, r"calls a child twice \(\['first', 'first'\]\)")])
def test_tied_and_reused_children_are_refused(module, why):
    with pytest.raises(NotAChain, match=why):
        chain_of(R.model(module()), torch.as_tensor(X[:4]))


def test_a_traced_module_is_a_chain_too():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(bn_dropout_net(0.0).eval(), torch.as_tensor(X[:4]))
    with pytest.warns(DeprecationWarning, match="deprecates TorchScript"):
        model = R.model(traced)
    units = chain_of(model, torch.as_tensor(X[:6]))
    assert [unit.name for unit in units] == [str(k) for k in range(8)]
    assert units[0].params == [0] and units[1].buffers == [0, 1, 2] and units[-1].output_shape == (3,)
    # the first Linear holds its weight four times (value, gradient, two Adam moments); its output is 6 x 8 floats
    assert units[0].param_bytes == 4 * 8 * 5 * 4 and units[0].output_bytes == 6 * 8 * 4


def test_frozen_parameters_are_read_by_their_stage_and_never_stepped():
    def frozen_net():
        net = bn_dropout_net(0.3)
        net[0].weight.requires_grad_(False)
        return net
    graph = R.Graph(name="frozen", seed=GRAPH_SEED)
    model = Pytorch_Model(R.model(frozen_net()))
    model.initialize(Adam(lr=LR))
    names = list(model.fit(X, Y, 1, 12, loss="SquareLoss", strategy=R.parallel.Pipeline(stages=2, micro_batches=2),
                           shuffle=True, seed=SHUFFLE_SEED))
    model.params[0].persist_op("frozen weight")
    model.params[-1].persist_op("last bias")
    values = evaluate_persisted(graph)
    want, net = gpipe_reference(frozen_net, cut_of(frozen_net(), 2, 6), 1, 12, 2, square_loss)
    assert all(abs(float(values[n]) - float(w)) < 1e-5 for n, w in zip(names, want))
    assert torch.equal(values["frozen weight"], frozen_net()[0].weight.detach())
    assert torch.allclose(values["last bias"], net[-1].bias.detach(), atol=1e-5)
