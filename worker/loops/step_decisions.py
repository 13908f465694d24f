"""Where a worker keeps the step compiler's decisions (`ravop.runtime.step_compiler`: whether a step template runs
faster compiled or op by op on this machine): beside its calibration figures (worker/execute/calibration_cache.py),
keyed by the template's digest and the machine's key, so that a loop of a template measured before starts with
the faster variant, in this worker and the next one started on the machine. Without a cache file
($RAVOP_CALIBRATION_CACHE set empty) they are kept for the life of the process."""
import json
from typing import Optional, Union

import torch

from ravop.runtime.step_compiler import MemoryDecisions

from ..execute import calibration_cache

FIELDS = ("compiled",)


class CachedDecisions:
    def __init__(self, device: Union[str, torch.device], path: Optional[str] = None) -> None:
        self.path = calibration_cache.default_path() if path is None else path
        self.machine = calibration_cache.machine_key(torch.device(device))
        self.memory = MemoryDecisions()
        self.missing: set[str] = set()   # digests the file did not have when first asked

    def _key(self, digest: str) -> str:
        return json.dumps({"step": digest, "machine": json.loads(self.machine)}, sort_keys=True)

    def load(self, digest: str) -> Optional[dict[str, float]]:
        if digest in self.missing:
            return None
        figures = self.memory.load(digest)
        if figures is None:   # read from the file once: each loop's templates would parse it again (~0.5 ms)
            figures = calibration_cache.load(self.path, self._key(digest), FIELDS)
            if figures is None:
                self.missing.add(digest)   # this process decides it, or runs it undecided (too few runs)
            else:
                self.memory.store(digest, figures)
        return figures

    def store(self, digest: str, figures: dict[str, float]) -> None:
        self.missing.discard(digest)
        self.memory.store(digest, figures)
        calibration_cache.store(self.path, self._key(digest), figures)


_by_device: dict[str, CachedDecisions] = {}


def for_device(device: Union[str, torch.device]) -> CachedDecisions:
    """The decisions of this process's loops on `device` (one object, so that the file is read once per key)."""
    name = str(device)
    if name not in _by_device:
        _by_device[name] = CachedDecisions(name)
    return _by_device[name]
