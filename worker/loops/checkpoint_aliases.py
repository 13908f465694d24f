"""A loop checkpoint stores each distinct carried value once. A resident DiLoCo replica checkpointed at a
synchronisation carries its parameters and its copy of the global model with the same bits (every replica has
just restarted from the global model), as are the zero-filled optimizer moments and error-feedback residuals
before the first steps: storing them twice would be bytes up the provider's link for nothing. A later value
equal to an earlier one (same dtype, shape and bits) is written as an alias of it, "k=j" in the checkpoint's
`same` field; resuming copies value j into slot k, so the loop resumes with the same bits."""
from typing import Any, Optional, Sequence

import torch


def aliases(values: Sequence[Any]) -> dict[int, int]:
    """{k: j} for each value k bit-equal to an earlier value j (the first such j), among host tensors."""
    found: dict[int, int] = {}
    seen: dict[tuple[Any, ...], list[int]] = {}
    for k, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            continue
        signature = (value.dtype, tuple(value.shape), value.device.type)
        for j in seen.get(signature, ()):
            if _same_bits(values[j], value):
                found[k] = j
                break
        else:
            seen.setdefault(signature, []).append(k)
    return found


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: torch.equal says -0.0 equals 0.0 and NaN differs from itself, so floats compare as
    integers of their width."""
    if a.is_floating_point() or a.is_complex():
        a, b = _as_bits(a), _as_bits(b)
    return torch.equal(a, b)


def _as_bits(value: torch.Tensor) -> torch.Tensor:
    width = value.element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(width)
    if view is None:   # complex128 and wider: compare their bytes
        return value.contiguous().view(torch.uint8)
    return value.contiguous().view(view)


def encode(found: dict[int, int]) -> str:
    """The checkpoint hash's `same` field: "k=j,..." ("" without aliases)."""
    return ",".join(f"{k}={j}" for k, j in sorted(found.items()))


def decode(field: Optional[bytes], n: int) -> dict[int, int]:
    """{k: j} from a `same` field (bytes, or None for a checkpoint written without one); ValueError if
    malformed: an alias must name an earlier, stored slot of the `n`."""
    if not field:
        return {}
    found: dict[int, int] = {}
    for pair in field.decode().split(","):
        later, sep, earlier = pair.partition("=")
        k, j = int(later), int(earlier)
        if not sep or not 0 <= j < k < n or j in found:
            raise ValueError(f"bad checkpoint alias {pair!r}")
        found[k] = j
    return found
