"""fit's data check counts NaN and infinities exactly whatever the one-pass shortcut (a finite sum) decides:
a finite array whose sum overflows, and non-finite values anywhere in a chunk, numpy and torch alike."""
import warnings

import numpy as np
import pytest
import torch

from ravdl.v2 import nonfinite


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_counts_are_exact_when_the_sum_overflows_or_a_value_is_not_finite(kind, monkeypatch):
    monkeypatch.setattr(nonfinite, "CHUNK", 1000)
    big = np.full(2500, np.finfo(np.float32).max, dtype=np.float32)   # finite, but its sum overflows
    values = np.random.default_rng(0).random(2500).astype(np.float32)
    values[[5, 1999]] = np.nan
    values[1500], values[2499] = np.inf, -np.inf
    wrap = torch.from_numpy if kind == "torch" else np.asarray
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no numpy overflow warning for the user
        assert nonfinite.counts(wrap(big)) == (0, 0, 0, 2500)
    assert nonfinite.counts(wrap(values)) == (2, 1, 1, 2500)
    assert nonfinite.counts(wrap(np.ones(3000, dtype=np.float32))) == (0, 0, 0, 3000)
