"""Which numerics a process computes with: `RAVOP_NUMERICS` (`ravop-worker --numerics`, `R.initialize(numerics=)`).

"default": each op's own torch kernel, whose last bits depend on the CPU's vector unit, the BLAS code path and the
thread count. "reproducible": each op's kernel of ravop/ops/reproducible.py, the same bits on every x86 CPU class and
thread count (docs/reports/reproducible_numerics.md); an op without one is refused, never run the default way.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

ENV = "RAVOP_NUMERICS"
DEFAULT, REPRODUCIBLE = "default", "reproducible"
MODES = (DEFAULT, REPRODUCIBLE)


def check(mode: str) -> str:
    """`mode` if it is one of MODES, else a ValueError naming them."""
    if mode not in MODES:
        raise ValueError(f"numerics must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def current(environ: Optional[Mapping[str, str]] = None) -> str:
    """This process's mode, from its environment or `environ` (unset or empty: default)."""
    value = (os.environ if environ is None else environ).get(ENV) or DEFAULT
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: must be one of {', '.join(MODES)}")
    return value


def reproducible() -> bool:
    return current() == REPRODUCIBLE
