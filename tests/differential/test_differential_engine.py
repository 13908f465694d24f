"""The differential matrix through the engine: the embedded server and two worker processes (one torch thread
each) run each architecture x model kind by every path a user takes, and the training losses, the eval output
after training, every parameter and buffer and the fetched saved model must be bit-equal to eager PyTorch:
- 3 hand-written steps, computed by constant folding at R.activate();
- 20 hand-written steps, folded into a loop run on a worker (its step compiled: in-place optimizer steps, groups);
- `fit` (one loop), and `fit` under a strategy with one replica (LocalSGD(1); DataParallel(1) where the model has
  no buffers: it refuses BatchNorm);
- `fit` resumed from its checkpoint by another worker after the first is killed (test_differential_resume.py:
  its workers must be the only ones).
Optimizer configurations are crossed with the paths on one architecture (every optimizer x every kind is in
test_differential.py, in process)."""
import pytest
import torch

import ravop as R
from differential import (ARCHS, KINDS, OPTIMS, EagerTraining, assert_bit_equal, batches_of, build, eager_eval,
                          eager_state, record_steps)

EPOCHS, ROWS, BATCH = 2, 48, 16


def run_and_fetch(persisted, timeout=300):
    """Activate and execute the current graph on the workers; fetch `persisted` (name -> anything) by name."""
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)
    return {name: R.fetch_persisting_op(name) for name in persisted}


def persist(ops, prefix):
    names = {f"{prefix}_{k}": op for k, op in ops.items()}
    for name, op in names.items():
        op.persist_op(name)
    return names


def check(built, fetched, got_losses, want_losses, X_eval, kind):
    """Losses, eval output, every state value and the saved model, against the eager twin after its training."""
    assert_bit_equal({"losses": got_losses}, {"losses": want_losses}, "training losses")
    want_eval = eager_eval(built.eager, X_eval)
    assert_bit_equal({"eval": fetched["eval"]}, {"eval": want_eval}, "eval output after training")
    state = {name[len("state_"):]: value for name, value in fetched.items() if name.startswith("state_")}
    assert_bit_equal(state, eager_state(built.eager), "parameters and buffers")
    saved = fetched["saved"]
    saved_state = saved.state_dict()
    names = built.saved_names or {name: name for name in built.eager.state_dict()}
    assert_bit_equal({name: saved_state[names[name]] for name in names},
                     {name: value for name, value in built.eager.state_dict().items() if name in names},
                     "saved model")
    saved.eval()
    with torch.no_grad():
        assert_bit_equal({"out": saved(X_eval)}, {"out": want_eval}, f"saved {kind} model's output")


def record_after_training(built, X_eval):
    """Persist the eval output, every state value and the saved model; returns the names to fetch."""
    names = {"eval": built.forward(X_eval, training=False)}
    names["eval"].persist_op("eval")
    names.update(persist(built.state(), "state"))
    built.model.save_model("saved")
    names["saved"] = None
    return names


HAND_WRITTEN = [(a, k, steps) for a in ARCHS for k in KINDS for steps in (3, 20)]


@pytest.mark.parametrize("arch, kind, steps", HAND_WRITTEN, ids=[f"{a}-{k}-{s}steps" for a, k, s in HAND_WRITTEN])
def test_hand_written_steps_on_the_engine_match_eager(engine, module_workers, arch, kind, steps):
    arch, optim = ARCHS[arch], OPTIMS["adam"]
    R.Graph(name=f"engine {arch.name} {kind} {steps}")
    batches = batches_of(arch, steps)
    X_eval = arch.data(arch.eval_rows)[0]
    built = build(arch, optim, kind, batches[0][0][:2])
    losses = record_steps(arch, built, batches)
    names = {**persist(dict(enumerate(losses)), "loss"), **record_after_training(built, X_eval)}
    fetched = run_and_fetch(names)
    got_losses = torch.stack([fetched[f"loss_{k}"] for k in range(steps)])
    want_losses = EagerTraining(arch, optim, built.eager).steps(batches)
    check(built, fetched, got_losses, want_losses, X_eval, kind)


def record_fit(arch, built, kind, strategy=None):
    X, y = arch.data(ROWS)
    kwargs = {} if kind == "sequential" else {"loss": arch.loss}
    history = built.model.fit(X, y, n_epochs=EPOCHS, batch_size=BATCH, strategy=strategy, **kwargs)
    batches = [(X[i:i + BATCH], y[i:i + BATCH]) for i in range(0, ROWS, BATCH)] * EPOCHS
    return list(history), batches


STRATEGIES = {"local_sgd_1": lambda: R.parallel.LocalSGD(1, sync_every=2),
              "data_parallel_1": lambda: R.parallel.DataParallel(1)}
FITS = [(a, k, "adam", s) for a in ARCHS for k in KINDS for s in (None, "local_sgd_1")] + \
       [("embed_ln", k, "adam", "data_parallel_1") for k in KINDS] + \
       [("mlp_bn", k, o, None) for k in KINDS for o in OPTIMS if o != "adam"]


@pytest.mark.parametrize("arch, kind, optim, strategy", FITS, ids=[f"{a}-{k}-{o}-{s or 'plain'}"
                                                                 for a, k, o, s in FITS])
def test_fit_on_the_engine_matches_eager(engine, module_workers, arch, kind, optim, strategy):
    arch, optim = ARCHS[arch], OPTIMS[optim]
    R.Graph(name=f"fit {arch.name} {kind} {optim.name} {strategy}")
    X_eval = arch.data(arch.eval_rows)[0]
    built = build(arch, optim, kind, arch.data(2)[0])
    loss_names, batches = record_fit(arch, built, kind, STRATEGIES[strategy]() if strategy else None)
    names = {**{name: None for name in loss_names}, **record_after_training(built, X_eval)}
    fetched = run_and_fetch(names)
    got_losses = torch.stack([torch.as_tensor(fetched[name]) for name in loss_names])
    want_losses = EagerTraining(arch, optim, built.eager).steps(batches)
    check(built, fetched, got_losses, want_losses, X_eval, kind)
