"""The differential matrix's checkpoint path: a fit whose worker is killed mid-loop is resumed from its checkpoint by
another worker, and its losses, eval output, parameters, running statistics and saved model are bit-equal to eager
PyTorch. In a module of its own: the test kills the worker holding the loop, so its workers must be the only ones
(test_differential_engine.py's module workers would take loops too)."""
import torch

import ravop as R
from differential import ARCHS, OPTIMS, EagerTraining, build
from helpers import wait_for
from ravop.store import GraphKeys
from ravop.store import graphs as store_graphs
from test_differential_engine import BATCH, ROWS, check, record_after_training


def test_a_fit_resumed_from_its_checkpoint_by_another_worker_matches_eager(engine, workers, client):
    """The worker holding the loop is killed after a checkpoint; another resumes from it: the same bits as eager,
    eval output and running statistics included. Steps paced to ~4 ms so that the kill lands mid-loop."""
    holders = workers.start(2, reclaim_idle=1.0, extra=("--checkpoint-steps", "5", "--emulate-device-flops", "4e6"))
    arch, optim, kind = ARCHS["mlp_bn"], OPTIMS["adam"], "functional"
    graph = R.Graph(name="resumed fit")
    X_eval = arch.data(arch.eval_rows)[0]
    built = build(arch, optim, kind, arch.data(2)[0])
    X, y = arch.data(ROWS)
    epochs = 400
    loss_names = list(built.model.fit(X, y, n_epochs=epochs, batch_size=BATCH, loss=arch.loss))
    names = {**{name: None for name in loss_names}, **record_after_training(built, X_eval)}
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    wait_for(lambda: any(client.type(key) == b"hash" and client.hexists(key, "step")
                         for key in client.keys(keys.prefix + "ckpt:*")), "a checkpoint")
    loop_id = next(int(s) for s in client.hkeys(keys.taken))
    holder = client.hget(keys.taken, loop_id).decode()
    workers.kill(holder)
    assert store_graphs.steps_done(client, keys) < epochs * 3, "the loop ended before the kill: make it longer"
    R.track_progress(progress_bar=False, timeout=300)
    assert client.hget(keys.ran, loop_id).decode() == next(n for n in holders if n != holder)
    fetched = {name: R.fetch_persisting_op(name) for name in names}
    got_losses = torch.stack([torch.as_tensor(fetched[name]) for name in loss_names])
    batches = [(X[i:i + BATCH], y[i:i + BATCH]) for i in range(0, ROWS, BATCH)] * epochs
    want_losses = EagerTraining(arch, optim, built.eager).steps(batches)
    check(built, fetched, got_losses, want_losses, X_eval, kind)
