"""worker/loops/checkpoint_aliases.py: a loop checkpoint stores each distinct carried value once; what is aliased has
the same dtype, shape and bits, and resuming restores the same bits."""
import pytest
import torch

from worker.loops.checkpoint_aliases import aliases, decode, encode


def test_values_with_the_same_bits_are_aliased_to_the_first():
    w = torch.randn(4, 3)
    values = [w, torch.zeros(3), w.clone(), torch.zeros(3), torch.zeros(3, dtype=torch.float64), w + 1]
    found = aliases(values)
    assert found == {2: 0, 3: 1}
    assert decode(encode(found).encode(), len(values)) == found


def test_only_identical_bits_alias():
    zero, negative_zero = torch.zeros(2), torch.tensor([0.0, -0.0])
    nan = torch.tensor([float("nan"), 1.0])
    # -0.0 == 0.0 but is another value; NaN != NaN but the same bits resume the same
    assert aliases([zero, negative_zero]) == {}
    assert aliases([nan, nan.clone()]) == {1: 0}
    assert aliases([torch.zeros(2, 3), torch.zeros(3, 2), torch.zeros(6)]) == {}
    assert aliases([torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int32)]) == {}
    assert aliases([torch.ones(2), 1.0, 1.0]) == {}   # only tensors


def test_a_checkpoint_without_aliases_and_bad_fields():
    assert encode({}) == "" and decode(b"", 3) == {} and decode(None, 3) == {}
    for bad in (b"1=1", b"2=0,3=2", b"5=0", b"1", b"a=b", b"0=1"):
        with pytest.raises(ValueError):
            decode(bad, 4)
