"""A worker's numerics class: what decides the bits of its kernels' results, as it advertises them. Two honest
workers of one class give identical bits for the same graph and seed; across classes they may differ in the last
bits (issue 42 measured which kernels: ATen's vector kernels by CPU capability, oneDNN by its ISA, MKL by its
conditional-bitwise-reproducibility setting, reductions and small GEMMs by the intra-op thread count), so
verify='spot' re-runs a result within its runner's class where it can and otherwise judges by a tolerance
(ravop/core/spot_policy.py).

The class is "<device kind>/torch<version>/<ATen capability>/mkl=<MKL_CBWR>/isa=<ONEDNN_MAX_CPU_ISA>/t<threads>"
(the variables read as the libraries read them: unset is '-'); with RAVOP_NUMERICS=reproducible (a mode that
promises identical bits on any CPU and thread count) it is "reproducible/torch<version>/<device kind>"."""
import os
from typing import Mapping, Optional

from . import numerics_mode

# Characters that the SPOT script and segment ids use as separators, never in a class.
_SEPARATORS = (":", ",", ";", "@", " ")


def numerics_class(device_kind: str, threads: int, environ: Optional[Mapping[str, str]] = None) -> str:
    """This process's class on device kind `device_kind` ('cpu', 'cuda') running `threads` intra-op threads."""
    import torch   # here, not at import: ravop.core stays light for the requester

    env = os.environ if environ is None else environ
    version = torch.__version__.split("+")[0]
    if numerics_mode.current(env) == numerics_mode.REPRODUCIBLE:
        text = f"reproducible/torch{version}/{device_kind}"
    else:
        text = (f"{device_kind}/torch{version}/{torch.backends.cpu.get_cpu_capability().lower()}/"
                f"mkl={env.get('MKL_CBWR') or '-'}/isa={env.get('ONEDNN_MAX_CPU_ISA') or '-'}/t{threads}")
    for separator in _SEPARATORS:
        text = text.replace(separator, "_")
    return text
