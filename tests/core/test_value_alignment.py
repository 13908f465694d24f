"""Where a value lies in memory does not change its bits (ravop/core/alignment.py): MKL's sgemm rounds otherwise for
data that does not start on a 16-byte boundary, so a linear layer over rows sliced out of a batch (a view 120
bytes in) gave other bits than over the same rows uploaded alone (issue 40: a resident Pipeline against its
segments). The ops that hand out views at an offset hand out aligned values, and constants are read aligned."""
import numpy as np
import pytest
import torch

import ravop as R
from ravop.core.alignment import ALIGNMENT, aligned
from ravop.core.errors import RavopError
from ravop.record.graph import to_tensor
from ravop.runtime.evaluate import evaluate
from test_registry_walk import CASES, _record

RNG = np.random.default_rng(0)
X = RNG.normal(size=(12, 5)).astype(np.float32)   # a row is 20 bytes: row 6 starts 120 bytes in
W = RNG.normal(size=(8, 5)).astype(np.float32)


def test_mkl_rounds_by_alignment_which_is_why_values_are_aligned():
    """The kernel-level fact the rule rests on (if a later MKL stops doing this, the rule costs a copy, no bits)."""
    x, w = torch.as_tensor(X), torch.as_tensor(W)
    offsets = [k for k in range(1, 7) if not torch.equal(x[k:k + 6] @ w.T, x[k:k + 6].clone() @ w.T)]
    if not offsets:
        pytest.skip("this BLAS gives the same bits at any alignment")
    assert all(x[k:].data_ptr() % ALIGNMENT for k in offsets)


@pytest.mark.parametrize("cut", ["index", "split", "slice"])
def test_rows_cut_out_of_a_batch_give_the_bits_of_the_same_rows_uploaded_alone(cut):
    R.Graph(name="alignment")
    batch = R.t(X) * 1.0   # an op's output: the cut is a view of it
    rows = {"index": lambda: batch[6:12], "split": lambda: R.split(batch, numOrSizeSplits=2)[1],
            "slice": lambda: R.slice(batch, begin=6, size=6)}[cut]()
    got, want = evaluate([R.linear(rows, R.t(W)), R.linear(R.t(X[6:12].copy()), R.t(W))])
    assert torch.equal(got, want)
    assert evaluate(rows).data_ptr() % ALIGNMENT == 0


def test_a_constant_made_from_a_slice_of_an_array_computes_as_on_a_worker():
    """R.t(X[6:12]) shares X's memory (no copy at record time); it is read aligned, as a worker reads it from the
    store, by in-process evaluation and by constant folding at activate."""
    R.Graph(name="alignment constant")
    out = R.linear(R.t(X[6:12]), R.t(W))
    assert torch.equal(evaluate(out), torch.as_tensor(X[6:12].copy()) @ torch.as_tensor(W).T)


def test_aligned_copies_only_what_is_not_aligned():
    x = torch.arange(40, dtype=torch.float32)
    view = x[4:]   # 16 bytes in
    assert aligned(x) is x and aligned(view) is view
    moved = aligned(x[1:])
    assert moved.data_ptr() % ALIGNMENT == 0 and torch.equal(moved, x[1:])
    assert aligned(x[1:1]).numel() == 0


def _float32(t):
    return t.to(torch.float32) if t.dtype == torch.float64 else t


def test_no_op_hands_out_a_value_off_the_boundary():
    """The registry walk's samples, as given and in float32 (4-byte elements: a cut one element in is off the
    boundary), run through the interpreter: every value an op hands out starts on an ALIGNMENT boundary. A new op
    that hands out a view of its input at an offset (as index, split, slice, pad's VJP and the federated releases
    did) fails here until its kernel returns `aligned(...)`."""
    off = set()
    for case in CASES:
        name, sample = case.values
        for convert in (lambda t: t, _float32):
            R.Graph(name=f"aligned-{name}")
            try:
                outputs, _ = _record(name, [convert(to_tensor(x)) for x in sample.inputs], sample.params)
                values = evaluate(outputs)
            except (RavopError, TypeError, ValueError, RuntimeError):
                assert convert is _float32, f"{name}: the sample as given fails"
                continue   # an op that takes float64 only
            off.update(f"{name} ({sample.note or sample.params})" for value in values
                       if isinstance(value, torch.Tensor) and value.numel() and value.data_ptr() % ALIGNMENT)
    assert not off, f"ops handing out values off a {ALIGNMENT}-byte boundary: {sorted(off)}"
