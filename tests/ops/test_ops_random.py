"""Random ops draw from a generator seeded by the graph seed and the op: re-runs repeat, ops differ."""
import pytest
import torch

import ravop as R
from ravop.core.errors import ShapeError
from ravop.runtime.evaluate import evaluate


def test_a_rerun_gives_the_same_numbers():
    R.Graph(name="rng", seed=7)
    a = R.random_uniform(-1.0, 1.0, size=(50,))
    first = evaluate(a)
    torch.testing.assert_close(evaluate(a), first, rtol=0, atol=0)
    R.Graph(name="rng again", seed=7)  # an identical program in a fresh graph
    torch.testing.assert_close(evaluate(R.random_uniform(-1.0, 1.0, size=(50,))), first, rtol=0, atol=0)


def test_different_ops_and_seeds_differ():
    R.Graph(name="rng", seed=7)
    a, b = R.random(size=(50,)), R.random(size=(50,))
    va, vb = evaluate([a, b])
    assert not torch.equal(va, vb)
    assert not torch.equal(evaluate(a, graph_seed=8), va)


def test_values_lie_in_range_with_the_requested_dtype():
    R.Graph(name="rng")
    u = evaluate(R.random_uniform(low=2.0, high=5.0, size=(4000,), dtype="float64"))
    assert u.dtype == torch.float64 and u.min() >= 2.0 and u.max() < 5.0
    assert abs(u.mean().item() - 3.5) < 0.1  # uniform, not a constant or another distribution
    r = evaluate(R.random(size=(2, 3)))
    assert r.shape == (2, 3) and r.dtype == torch.float32 and ((r >= 0) & (r < 1)).all()


def test_bad_params_raise_when_recorded():
    R.Graph(name="rng")
    with pytest.raises(ShapeError, match="low <= high"):
        R.random_uniform(low=1.0, high=0.0, size=3)
    with pytest.raises(ShapeError, match="not a floating-point dtype"):
        R.random(size=3, dtype="int64")
    with pytest.raises(ShapeError, match="non-negative ints"):
        R.random(size=(2, -1))
