"""The differential matrix, in process: every architecture (every layer kind) x every optimizer configuration x
every model kind, trained by 20 hand-written steps, against the same training in eager PyTorch: the training
losses, the eval output after 1, 2, 3 and 20 steps, every parameter and buffer (BatchNorm's running statistics)
and the saved model (its state_dict and output) must be bit-equal. The engine's paths (folded loops, fit,
strategies, checkpoints) are in test_differential_engine.py."""
import os
import subprocess
import sys

import pytest
import torch

import ravop as R
from differential import (ARCHS, KINDS, OPTIMS, EagerTraining, assert_bit_equal, batches_of, build, eager_eval,
                          eager_state, record_steps)
from helpers import on_one_thread
from ravop.runtime.evaluate import evaluate
from test_ravdl_models import fetch_in_process

STEPS = 20
EVAL_AFTER = (1, 2, 3, 20)
CASES = [(a, o, k) for a in ARCHS for o in OPTIMS for k in KINDS]


@pytest.mark.parametrize("arch, optim, kind", CASES, ids=["-".join(c) for c in CASES])
def test_hand_written_steps_match_eager_pytorch(arch, optim, kind):
    arch, optim = ARCHS[arch], OPTIMS[optim]
    R.Graph(name=f"differential {arch.name} {optim.name} {kind}")
    batches = batches_of(arch, STEPS)
    X_eval = arch.data(arch.eval_rows)[0]
    built = build(arch, optim, kind, batches[0][0][:2])
    losses, evals = [], {}
    for step, batch in enumerate(batches, 1):
        losses += record_steps(arch, built, [batch])
        if step in EVAL_AFTER:
            evals[step] = built.forward(X_eval, training=False)
    state = built.state()
    if kind != "pytorch":
        built.model.save_model("saved")
    got = on_one_thread(evaluate, losses + list(evals.values()) + list(state.values()))

    want_evals = {}
    eager_losses = []
    done = 0
    training = EagerTraining(arch, optim, built.eager)
    for step in EVAL_AFTER:
        eager_losses.append(training.steps(batches[done:step]))
        done = step
        want_evals[step] = eager_eval(built.eager, X_eval)
    assert_bit_equal({"losses": torch.stack(got[:STEPS])}, {"losses": torch.cat(eager_losses)}, "training losses")
    assert_bit_equal(dict(zip(evals, got[STEPS:STEPS + len(evals)])), want_evals, "eval output after n steps")
    assert_bit_equal(dict(zip(state, got[STEPS + len(evals):])), eager_state(built.eager), "parameters and buffers")
    if kind != "pytorch":
        saved = on_one_thread(fetch_in_process, "saved")
        saved_state = saved.state_dict()
        assert sorted(saved_state) == sorted(built.saved_names.values())
        assert_bit_equal({name: saved_state[built.saved_names[name]] for name in built.saved_names},
                         built.eager.state_dict(), "saved model")
        assert_bit_equal({"out": on_one_thread(saved, X_eval)}, {"out": want_evals[STEPS]}, "saved model's output")


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_the_matrix_holds_under_every_cpu_capability(capability):
    """ATen picks its vector kernels by the CPU's instruction set: the engine and eager must agree whichever it
    picks, so this machine runs the matrix as an AVX2-only and a pre-AVX CPU would (ATEN_CPU_CAPABILITY caps
    the choice) and a development machine catches what another CPU would see."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             "-k", "test_hand_written_steps_match_eager_pytorch", __file__],
                            env=env, capture_output=True, text=True, timeout=600, cwd=os.path.dirname(__file__))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"{len(CASES)} passed" in result.stdout
