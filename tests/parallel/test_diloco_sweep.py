"""benchmarks/wan/overlap_sweep.py's batched DiLoCo simulation (the WAN lab's task without the lab) computes
what tests/parallel/test_diloco.py's eager reference computes, the reference R.parallel.DiLoCo is checked against: with and
without overlap (and overlap_start='local', the sweep's mode 'local'), fp32 and int8."""
import pytest
import torch

from benchmarks.wan.overlap_sweep import simulate
from test_diloco import diloco_reference
from test_parallel_math import LR, X, Y, torch_net


@pytest.mark.parametrize("compression, overlap, nesterov", [(None, False, True), ("int8", False, False),
                                                            ("int8", True, True), (None, True, False)])
def test_the_sweep_simulates_the_eager_reference(compression, overlap, nesterov):
    replicas, inner_steps, epochs, batch = 3, 3, 3, 5
    _, want, _ = diloco_reference(replicas, inner_steps, epochs, batch, False, 3, 0.7, 0.9, nesterov,
                                  compression, overlap)
    got = simulate(torch_net(), X, Y, replicas, inner_steps, epochs, batch, lr=LR, outer_lr=0.7,
                   outer_momentum=0.9, nesterov=nesterov, compression=compression, overlap=overlap, loss="mse")
    for g, w in zip(got.parameters(), want):
        assert (g.detach() - w).abs().max() <= 1e-5


def test_the_sweeps_local_mode_is_overlap_start_local():
    _, want, _ = diloco_reference(3, 3, 3, 5, False, 3, 0.7, 0.9, True, "int8", True, overlap_start="local")
    got = simulate(torch_net(), X, Y, 3, 3, 3, 5, lr=LR, compression="int8", overlap=True, mode="local", loss="mse")
    for g, w in zip(got.parameters(), want):
        assert (g.detach() - w).abs().max() <= 1e-5


def test_the_sweep_refuses_unknown_modes():
    with pytest.raises(ValueError, match="mode"):
        simulate(torch_net(), X, Y, 2, 2, 1, 5, mode="lazy")
