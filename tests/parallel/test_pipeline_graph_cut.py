"""Pipeline over a model whose forward is not a chain of its children: the torch.fx trace of the nn.Module cut at
any point (ravop/record/graph_stages.py), several tensors crossing a cut packed into one, sizes recomputed, a tied
parameter read by two stages stepped once on the sum of their gradients. Checked against eager PyTorch's
GPipe-equivalent training (one model; per batch, each micro-batch's loss weighted by its share backpropagated in
turn; one Adam step) for torchvision's resnet18 (a faithful copy: ReLU(inplace=True), `out += identity`, the
downsample Sequential) and the GPT of benchmarks/real_models.py, unchanged; on a real server two workers run the
stages with the in-process bits; a module torch.fx cannot trace is refused naming the construct and its line."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from ravdl.v2 import Pytorch_Model
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.parallel.data_parallel import tensor_split
from ravop.parallel.pipeline import stage_seed
from ravop.record.graph_stages import NotTraceable, graph_cut
from ravop.record.torchscript_stages import NotAChain, chain_of
from ravop.runtime.evaluate import evaluate_persisted
from helpers import on_one_thread
from test_parallel_engine import assert_same_as_in_process, run_on_both

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from real_models import GPT, VOCAB, resnet18, _token_loss  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

LR, GRAPH_SEED, SHUFFLE_SEED = 0.01, 11, 3


def made(make):
    torch.manual_seed(0)
    return make()


def eager_gpipe(make, X, y, loss, batch_size, micro_batches):
    """The losses of eager GPipe-equivalent training, one epoch, batches in fit's shuffled order."""
    net = made(make).train()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(X))
    losses = []
    for start in range(0, len(X), batch_size):
        rows = order[start:start + batch_size]
        opt.zero_grad()
        total = 0.0
        for a, b in tensor_split(len(rows), micro_batches, "micro-batches"):
            micro = loss(net(torch.as_tensor(X[rows[a:b]])), torch.as_tensor(y[rows[a:b]])) * ((b - a) / len(rows))
            micro.backward()
            total = total + micro.detach()
        opt.step()
        losses.append(float(total))
    return losses


def engine_fit(make, X, y, loss, strategy, batch_size):
    graph = R.Graph(name="pipeline graph cut", seed=GRAPH_SEED)
    model = Pytorch_Model(R.model(made(make)))
    model.initialize(Adam(lr=LR))
    names = list(model.fit(X, y, 1, batch_size, loss=loss, strategy=strategy, shuffle=True, seed=SHUFFLE_SEED))
    return graph, names


def images(rows):
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 3, 32, 32, generator=g).numpy(), torch.randint(0, 10, (rows,), generator=g).numpy()


def tokens(rows):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (rows, 65), generator=g)
    return x[:, :-1].numpy(), x[:, 1:].numpy()


def gpt():
    return GPT(dropout=0.0)


def gpt_loss(out, y):
    return TF.cross_entropy(out.view(-1, VOCAB), y.view(-1))


CASES = {"resnet18": (lambda: resnet18(num_classes=10), images(16), "CrossEntropy", TF.cross_entropy),
         "gpt": (gpt, tokens(8), _token_loss, gpt_loss)}


@pytest.mark.parametrize("case", ["resnet18", "gpt"])
def test_a_real_model_pipeline_equals_eager_gpipe(case):
    make, (X, y), loss, torch_loss = CASES[case]
    with pytest.raises(NotAChain):   # neither is a chain of its children: they are cut on their traced graph
        chain_of(R.model(made(make)), torch.as_tensor(X[:4]))
    batch_size = len(X) // 2
    graph, names = engine_fit(make, X, y, loss, R.parallel.Pipeline(stages=2, micro_batches=2), batch_size)
    values = evaluate_persisted(graph)
    want = eager_gpipe(make, X, y, torch_loss, batch_size, 2)
    assert len(names) == len(want) == 2
    for name, loss_value in zip(names, want):
        assert abs(float(values[name]) - loss_value) < 1e-5, (name, float(values[name]), loss_value)


def test_a_cut_hands_on_every_tensor_that_crosses_it():
    """resnet18's cuts inside a residual block pass the block's input with the branch's output; the GPT's
    blocks recompute their sizes after a cut; the units' memory adds up the parameters' four copies."""
    X, _ = images(4)
    cut = graph_cut(made(CASES["resnet18"][0]), torch.as_tensor(X))
    assert max(len(crossing.packed) for crossing in cut.at.values()) == 2
    assert sum(cut.memory) > 4 * 4 * sum(p.numel() for p in made(CASES["resnet18"][0]).parameters())
    # stages='auto' over workers that hold half the model each: two stages, each within its worker's memory
    workers = [{"name": n, "kind": "cpu", "memory_limit": sum(cut.memory) * 0.6, "handoff_bytes_per_s": 1e8,
                "threads": 1} for n in "ab"]
    auto = R.parallel.Pipeline("auto").fit_to_workers(cut.memory, cut.boundary, workers)
    assert auto.stages == 2 and all(sum(cut.memory[a:b]) <= sum(cut.memory) * 0.6 for a, b in auto.cut(cut.memory))
    T, _ = tokens(4)
    cut = graph_cut(made(gpt), torch.as_tensor(T))
    assert any(n.target is getattr and n.args[1] == "shape" for c in cut.at.values() for n in c.recomputed)


class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(5, 5), torch.nn.Linear(5, 3)

    def forward(self, x):
        if x.sum() > 0:
            x = torch.relu(x)
        return self.second(x + self.first(x))


def test_a_module_torch_fx_cannot_trace_is_refused_naming_the_construct_and_line():
    X = np.ones((8, 5), dtype=np.float32)
    R.Graph(name="untraceable")
    model = Pytorch_Model(R.model(DataDependent()))
    model.initialize(Adam(lr=LR))
    with pytest.raises(NotTraceable, match=r"cannot trace DataDependent with torch.fx .* control flow at "
                                           r".*test_pipeline_graph_cut.py:\d+ \(if x.sum\(\) > 0:\)"):
        model.fit(X, X[:, :3], 1, 8, loss="SquareLoss", strategy=R.parallel.Pipeline(stages=2))


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(5, 5)

    def forward(self, x, y):
        return self.first(x) + y


def test_a_forward_of_two_inputs_is_refused_naming_them():
    with pytest.raises(NotTraceable, match="TwoInputs's forward takes 2 inputs and returns one value; Pipeline cuts a "
                                           "forward of one tensor"):
        graph_cut(TwoInputs(), torch.ones(4, 5))


def test_gpt_stages_run_on_two_workers_with_the_in_process_bits(engine, workers, client):
    names = workers.start(2)
    X, y = tokens(8)
    graph, persisted = engine_fit(gpt, X, y, _token_loss, R.parallel.Pipeline(stages=2, micro_batches=2), 4)
    assert "stage 1 on" in str(on_one_thread(R.activate))
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted)


class Residual(torch.nn.Module):
    """x + f(x), then a functional relu and a view: three things a chain of children cannot hold."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.third = torch.nn.Linear(5, 5), torch.nn.Linear(5, 6), torch.nn.Linear(6, 3)

    def forward(self, x):
        h = torch.relu(self.second(x + self.first(x)))
        return self.third(h.view(h.shape[0], 2, 3).flatten(1))


def rows(n=24):
    X = np.random.default_rng(5).normal(size=(n, 5)).astype(np.float32)
    return X, np.tanh(X[:, :3] + X[:, 2:])


@pytest.mark.parametrize("stages, micro_batches", [(2, 3), (3, 2)])
def test_resident_and_segment_stages_of_a_residual_model_equal_eager_gpipe_and_each_other(stages, micro_batches):
    X, y = rows()
    values = {}
    for resident in (True, False):
        graph, names = engine_fit(Residual, X, y, "SquareLoss", R.parallel.Pipeline(stages, micro_batches,
                                                                                  resident=resident), 12)
        values[resident] = evaluate_persisted(graph)
        assert (len(graph.loops) == stages) == resident   # resident: one loop per stage; segments: one per pass
    want = eager_gpipe(Residual, X, y, TF.mse_loss, 12, micro_batches)
    for name, loss_value in zip(names, want):
        assert abs(float(values[True][name]) - loss_value) < 1e-5, name
        assert torch.equal(values[True][name], values[False][name]), name


def test_resident_stages_refuse_a_parameter_two_stages_read():
    X, y = tokens(8)
    with pytest.raises(ValueError, match="a parameter is read by two stages"):
        engine_fit(gpt, X, y, _token_loss, R.parallel.Pipeline(stages=2, resident=True), 4)


def test_resident_residual_stages_run_on_two_workers_with_the_in_process_bits(engine, workers, client):
    names = workers.start(2)
    X, y = rows()
    graph, persisted = engine_fit(Residual, X, y, "SquareLoss",
                                  R.parallel.Pipeline(stages=2, micro_batches=2, resident=True), 12)
    assert len(graph.loops) == 2   # resident: one loop per stage
    on_one_thread(R.activate)
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted)


def test_dropout_in_traced_stages_draws_each_stages_seed_in_forward_and_recompute():
    """The GPT with dropout 0.1: each stage's forward and its recompute draw the masks of the stage's seed
    (`stage_seed`), as eager GPipe running the same cut's stages (the traced graph's slices) seeded so; a reference
    seeded once per micro-batch draws other masks and other losses."""
    X, y = tokens(8)
    graph, names = engine_fit(GPT, X, y, _token_loss, R.parallel.Pipeline(stages=2, micro_batches=2), 4)
    values = evaluate_persisted(graph)
    cut = graph_cut(made(GPT), torch.as_tensor(X[:2]))
    modules = [cut.module(a, b) for a, b in R.parallel.Pipeline(2).cut(cut.memory)]

    def losses(seeded):
        cut.gm.load_state_dict(made(GPT).state_dict())
        opt = torch.optim.Adam(cut.gm.parameters(), lr=LR)
        order, out = np.random.default_rng(SHUFFLE_SEED).permutation(len(X)), []
        for index, start in enumerate(range(0, len(X), 4)):
            rows = order[start:start + 4]
            opt.zero_grad()
            total = 0.0
            for m, (a, b) in enumerate(tensor_split(4, 2, "micro-batches")):
                x = torch.as_tensor(X[rows[a:b]])
                for s, module in enumerate(modules):
                    if seeded or s == 0:
                        torch.manual_seed(stage_seed(GRAPH_SEED, index, m, s) if seeded else m)
                    x = module(x)
                micro = gpt_loss(x, torch.as_tensor(y[rows[a:b]])) * ((b - a) / 4)
                micro.backward()
                total = total + micro.detach()
            opt.step()
            out.append(float(total))
        return out
    for name, loss_value in zip(names, losses(True)):
        assert abs(float(values[name]) - loss_value) < 1e-5, name
    assert any(abs(float(values[n]) - w) > 1e-3 for n, w in zip(names, losses(False)))
