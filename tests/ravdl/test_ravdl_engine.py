"""RavDL through the real engine (a Valkey server and a worker process): every layer-parity case of
test_ravdl_layers.py, recorded into one graph, gives eager PyTorch's losses and weights; a saved model comes
back from R.fetch_persisting_op as a torch module computing the graph's prediction."""
import numpy as np
import torch

import ravop as R
from ravdl.v2.optimizers import Adam

from helpers import run_ops
from test_ravdl_layers import LAYER_CASES, OPTIMIZERS, assert_same_training, parity_case, record_ravdl, train_torch
from test_ravdl_models import ResidualNet


def test_every_layer_parity_case_through_the_engine(engine, workers):
    workers.start()
    R.Graph(name="ravdl parity")
    cases = [(case, optimizer) for case in sorted(LAYER_CASES) for optimizer in sorted(OPTIMIZERS)]
    recorded, ops = [], []
    for case, optimizer in cases:   # two dozen independent models in one graph
        modules, data, loss = parity_case(case)
        losses, state = record_ravdl(modules, OPTIMIZERS[optimizer][0], loss, data)
        recorded.append((len(ops), len(losses), list(state)))
        ops += losses + list(state.values())
    values = run_ops(ops, timeout=240)
    for (case, optimizer), (start, n_losses, keys) in zip(cases, recorded):
        modules, data, loss = parity_case(case)
        want_losses, want_state = train_torch(modules, OPTIMIZERS[optimizer][1], loss, data)
        got_losses = torch.stack(values[start:start + n_losses])
        got_state = dict(zip(keys, values[start + n_losses:start + n_losses + len(keys)]))
        assert_same_training(got_losses, got_state, want_losses, want_state, f"{case} {optimizer}")


def test_saved_model_is_fetched_as_a_torch_module(engine, workers):
    workers.start()
    R.Graph(name="ravdl save")
    model = ResidualNet(Adam(lr=0.01))
    rng = np.random.default_rng(0)
    for _ in range(5):
        X, y = rng.normal(size=(8, 5)).astype(np.float32), rng.random((8, 3)).astype(np.float32)
        model._backward_pass(R.square_loss(R.t(y), model._forward_pass(R.t(X))))
    X_new = torch.randn(6, 5)
    model._forward_pass(X_new, training=False).persist_op("prediction")
    model.save_model("residual_net")
    R.activate()
    R.execute()
    R.track_progress(timeout=120, progress_bar=False)
    module = R.fetch_persisting_op("residual_net")
    want = R.fetch_persisting_op("prediction")
    assert isinstance(module, torch.nn.Module)
    torch.testing.assert_close(module(X_new), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.jit.script(module)(X_new), want, rtol=0, atol=1e-6)


def test_training_again_after_flush_repeats_the_run(engine, workers):
    """A script that builds and trains a model can run twice in one process: R.flush() starts a new graph,
    the model is built again in it (same graph seed, same initial weights) and gives the same losses."""
    from test_ravdl_models import iris_model

    workers.start()
    X, y = np.random.default_rng(0).normal(size=(20, 4)), np.eye(3)[np.arange(20) % 3]
    runs = []
    for _ in range(2):
        R.flush()
        model = iris_model(Adam(lr=0.01))
        model.fit(X, y, n_epochs=3, batch_size=10)
        R.activate()
        R.execute()
        R.track_progress(timeout=120, progress_bar=False)
        runs.append(torch.stack([R.fetch_persisting_op(f"training_loss_epoch_{e}_batch_{b}")
                                 for e in (1, 2, 3) for b in (1, 2)]))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    assert runs[0][-1] < runs[0][0]
