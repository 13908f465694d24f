"""Every strategy trains any model through the same train-state interface: `Pytorch_Model.fit` over an
nn.Module and `Functional.fit` give what eager PyTorch computes for the same algorithm (the references of
tests/parallel/test_parallel_math.py and tests/parallel/test_diloco.py), a Pytorch_Model with BatchNorm averages its statistics
under DiLoCo, Pipeline cuts a Pytorch_Model or a Functional whose layers form a chain and refuses one that does
not, and on the engine a DiLoCo fit of a Pytorch_Model gives the in-process bits and saves the global model."""
import numpy as np
import pytest
import torch

from ravdl.v2 import Functional, Pytorch_Model
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.runtime.evaluate import evaluate_persisted
from test_diloco import diloco_reference
from test_parallel_engine import assert_same_as_in_process, run_on_both
from test_parallel_math import LR, X, Y, adam_step, batches_of, gossip_reference, local_sgd_reference, torch_net

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def bn_net():
    # No bias before BatchNorm: its gradient is rounding noise, which Adam scales up to lr-sized steps
    # (tests/record/test_torchscript.py's DigitsNet).
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(5, 8, bias=False), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3))


def pytorch_model(make_net=torch_net):
    model = Pytorch_Model(R.model(make_net()))
    model.initialize(Adam(lr=LR))
    return model


class TwoDense(Functional):
    """torch_net as a Functional model: Dense - tanh - Dense, from torch_net's initial weights."""

    def __init__(self):
        super().__init__()
        net = torch_net()
        self.first = Dense(8, initial_W=net[0].weight.detach().numpy(), initial_w0=net[0].bias.detach().numpy(),
                           input_shape=(5,))
        self.last = Dense(3, initial_W=net[2].weight.detach().numpy(), initial_w0=net[2].bias.detach().numpy())
        self.initialize_params(Adam(lr=LR))

    def _forward_pass_call(self, input, training=True):
        return self.last._forward_pass(self.first._forward_pass(input, training=training).tanh(), training=training)


class ChainedDense(TwoDense):
    """TwoDense with its tanh as a layer: a chain of layers, which Pipeline cuts."""

    def __init__(self):
        super().__init__()
        self.squash = Activation("tanh")
        self.initialize_params(Adam(lr=LR))

    def _forward_pass_call(self, input, training=True):
        hidden = self.squash._forward_pass(self.first._forward_pass(input, training=training), training=training)
        return self.last._forward_pass(hidden, training=training)


def fit(model, strategy, n_epochs, batch_size, shuffle=True, loss="SquareLoss"):
    """(loss by name, loss names, eval-mode prediction on X) of `model.fit(...)`, computed in-process."""
    graph = R.current_graph()
    names = list(model.fit(X, Y, n_epochs, batch_size, loss=loss, strategy=strategy, shuffle=shuffle, seed=3))
    model._forward_pass(R.t(X), training=False).persist_op("prediction")
    values = evaluate_persisted(graph)
    return {name: values[name] for name in names}, names, values["prediction"]


MODELS = [pytest.param(pytorch_model, id="Pytorch_Model"), pytest.param(TwoDense, id="Functional")]


def assert_replica_losses(got, losses, n_epochs, replicas, atol):
    per_epoch = len(losses[0]) // n_epochs
    for r in range(replicas):
        for k, loss in enumerate(losses[r]):
            e, b = divmod(k, per_epoch)
            assert torch.allclose(got[f"training_loss_epoch_{e + 1}_batch_{b * replicas + r + 1}"], loss, atol=atol)


@pytest.mark.parametrize("make_model", [pytest.param(pytorch_model, id="Pytorch_Model"),
                                        pytest.param(ChainedDense, id="Functional")])
@pytest.mark.parametrize("strategy", [None, R.parallel.DataParallel(replicas=2),
                                      R.parallel.Pipeline(stages=2, micro_batches=2),
                                      R.parallel.Pipeline(stages=3, micro_batches=3, replicas=2)],
                         ids=["one worker", "DataParallel", "Pipeline", "Pipeline with replicas"])
def test_one_worker_mathematics(make_model, strategy):
    """GPipe's micro-batches, without BatchNorm and Dropout, give one worker's gradients too
    (tests/parallel/test_pipeline_any_model.py has BatchNorm and Dropout)."""
    R.Graph(name="any model", seed=11)
    got, names, prediction = fit(make_model(), strategy, 2, 10)
    net = torch_net()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    want = [adam_step(net, opt, torch.as_tensor(X)[rows], torch.as_tensor(Y)[rows])
            for rows in batches_of(len(X), 10, 2, True, 3)]
    assert names == [f"training_loss_epoch_{e}_batch_{b}" for e in (1, 2) for b in range(1, 6)]
    assert torch.allclose(torch.stack([got[n] for n in names]), torch.stack(want), atol=1e-5)
    assert torch.allclose(prediction, net(torch.as_tensor(X)).detach(), atol=1e-5)


@pytest.mark.parametrize("make_model", MODELS)
def test_local_sgd(make_model):
    R.Graph(name="any model", seed=11)
    got, _, prediction = fit(make_model(), R.parallel.LocalSGD(replicas=2, sync_every=3), 2, 5)
    losses, want_prediction = local_sgd_reference(2, 3, 2, 5, True, 3, False)
    assert_replica_losses(got, losses, 2, 2, 1e-6)
    assert torch.allclose(prediction, want_prediction, atol=1e-6)


@pytest.mark.parametrize("make_model", MODELS)
def test_gossip(make_model):
    strategy = R.parallel.Gossip(replicas=4, interpolation="loss")
    R.Graph(name="any model", seed=11)
    got, _, _ = fit(make_model(), strategy, 1, 4, shuffle=False)
    assert_replica_losses(got, gossip_reference(strategy, 1, 4, graph_seed=11), 1, 4, 1e-5)


@pytest.mark.parametrize("make_model", MODELS)
@pytest.mark.parametrize("compression, overlap, update_frequency", [(None, False, 1), ("int8", True, 1),
                                                                     (None, False, 2)])
def test_diloco_of_any_model(make_model, compression, overlap, update_frequency):
    strategy = R.parallel.DiLoCo(replicas=2, inner_steps=3, compression=compression, overlap=overlap,
                                 update_frequency=update_frequency)
    R.Graph(name="any model", seed=11)
    got, _, prediction = fit(make_model(), strategy, 2, 5)
    losses, _, want_prediction = diloco_reference(2, 3, 2, 5, True, 3, 0.7, 0.9, True, compression, overlap,
                                                  update_frequency=update_frequency)
    assert_replica_losses(got, losses, 2, 2, 1e-5)
    assert torch.allclose(prediction, want_prediction, atol=1e-5)


def test_diloco_averages_batch_norm_statistics_of_a_pytorch_model():
    R.Graph(name="bn", seed=11)
    model = pytorch_model(bn_net)
    got, _, prediction = fit(model, R.parallel.DiLoCo(replicas=2, inner_steps=3), 2, 6)
    losses, _, want_prediction = diloco_reference(2, 3, 2, 6, True, 3, 0.7, 0.9, True, make_net=bn_net)
    assert_replica_losses(got, losses, 2, 2, 1e-5)
    assert torch.allclose(prediction, want_prediction, atol=1e-5)   # eval mode: the averaged running statistics


def test_cross_entropy_with_class_indices_equals_eager_pytorch():
    labels = Y.argmax(1)
    R.Graph(name="ce", seed=11)
    model = pytorch_model()
    names = list(model.fit(X, labels, 1, 16, loss="CrossEntropy"))
    values = evaluate_persisted(R.current_graph())
    net = torch_net()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    for name, rows in zip(names, batches_of(len(X), 16, 1, False, 0)):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.as_tensor(X)[rows]), torch.as_tensor(labels)[rows])
        loss.backward()
        opt.step()
        assert torch.allclose(values[name], loss.detach(), atol=1e-6)


def test_a_ravop_loss_is_accepted_and_bad_ones_are_refused():
    R.Graph(name="loss", seed=11)
    got, _, _ = fit(pytorch_model(), None, 1, 16, loss=R.square_loss)
    assert len(got) == 3
    with pytest.raises(ValueError, match="unknown loss 'Hinge'"):
        pytorch_model().fit(X, Y, 1, 16, loss="Hinge")


def test_pipeline_refuses_a_functional_that_is_not_a_chain_of_its_layers_by_name():
    R.Graph(name="pipeline")
    with pytest.raises(ValueError, match=r"TwoDense is not a chain of its layers: last reads tanh \(.*"
                                         r"test_strategies_any_model.py:\d+\), not the output of first"):
        TwoDense().fit(X, Y, 1, 8, strategy=R.parallel.Pipeline(stages=2))


def test_pytorch_model_diloco_on_two_workers_saves_the_global_model(engine, workers, client):
    names = workers.start(2)
    graph = R.Graph(name="pytorch diloco", seed=11)
    model = pytorch_model()
    persisted = list(model.fit(X, Y, 2, 5, loss="SquareLoss", shuffle=True, seed=3,
                               strategy=R.parallel.DiLoCo(replicas=2, inner_steps=3)))
    model._forward_pass(R.t(X), training=False).persist_op("prediction")
    model.save_model("trained")
    R.activate()
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted + ["prediction"])
    _, params, want_prediction = diloco_reference(2, 3, 2, 5, True, 3, 0.7, 0.9, True)
    saved = R.fetch_persisting_op("trained")
    with torch.no_grad():
        assert torch.allclose(saved(torch.as_tensor(X)), want_prediction, atol=1e-5)
    for got, want in zip(saved.parameters(), params):
        assert torch.allclose(got, want, atol=1e-5)
    assert np.isfinite(R.fetch_persisting_op("prediction").numpy()).all()


@pytest.mark.parametrize("make_model", MODELS)
def test_the_graphs_strategy_applies_to_their_fit(make_model):
    strategy = R.parallel.DiLoCo(replicas=2, inner_steps=3)
    R.Graph(name="explicit", seed=11)
    explicit, _, _ = fit(make_model(), strategy, 1, 6)
    graph = R.Graph(name="graph's", seed=11, strategy=strategy)
    default, _, _ = fit(make_model(), None, 1, 6)
    assert graph.strategy_notes.fits == [strategy]
    assert explicit.keys() == default.keys() and all(torch.equal(explicit[n], default[n]) for n in explicit)


@pytest.mark.parametrize("strategy", [R.parallel.LocalSGD(replicas=2, sync_every=3), R.parallel.Gossip(replicas=2)],
                         ids=["LocalSGD", "Gossip"])
def test_replicas_share_float_buffers_and_keep_integer_counters(strategy):
    """A Pytorch_Model's BatchNorm has a float running mean and an int64 batch count: the replicas average (or
    interpolate) the first and keep the second, which every replica advances alike."""
    R.Graph(name="counters", seed=11)
    model = pytorch_model(bn_net)
    fit(model, strategy, 2, 6)
    running_mean, _, batches = evaluate_persisted_values(model.buffers)
    assert batches.dtype == torch.int64 and int(batches) == 2 * 4   # 24 rows a shard in batches of 6, 2 epochs
    assert torch.isfinite(running_mean).all() and running_mean.abs().sum() > 0


def evaluate_persisted_values(ops):
    for k, op in enumerate(ops):
        op.persist_op(f"value {k}")
    values = evaluate_persisted(R.current_graph())
    return [values[f"value {k}"] for k in range(len(ops))]
