"""The machine's calibration figures (worker/serve/calibrate.py), kept in a small JSON file between worker starts: a
worker on the same machine, torch and thread count reads them instead of timing kernels while other work
competes for the cores (0.03 s quiet, 0.3 s on a busy machine), and advertises the same plan-changing figures
at every start. Any change of the key (CPU model, torch version, threads, device) measures again.

The file: $RAVOP_CALIBRATION_CACHE, else $XDG_CACHE_HOME/ravop/calibration.json (~/.cache/...); an empty
$RAVOP_CALIBRATION_CACHE turns the cache off."""
import json
import os
import platform
import tempfile
from typing import Any, Iterable, Optional

import torch

CACHE_ENV = "RAVOP_CALIBRATION_CACHE"


def default_path() -> str:
    """Where the figures are kept; "" (no cache) when $RAVOP_CALIBRATION_CACHE is set empty."""
    if CACHE_ENV in os.environ:
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ravop", "calibration.json")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(device: torch.device) -> str:
    """What the figures depend on, as one string: the same key, the same kernels at the same speed."""
    model = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model()
    return json.dumps({"device": str(device), "model": model, "cores": os.cpu_count(), "torch": torch.__version__,
                       "threads": torch.get_num_threads()}, sort_keys=True)


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            entries = json.load(f)
        return entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):   # none yet, unreadable or half-written by an older version: measure again
        return {}


def load(path: str, key: str, fields: Iterable[str]) -> Optional[dict[str, float]]:
    """{field: float} kept for `key`, or None if the cache has none (or not all of `fields`)."""
    if not path:
        return None
    figures = _read(path).get(key)
    if not isinstance(figures, dict) or not all(isinstance(figures.get(f), (int, float)) for f in fields):
        return None
    return {field: float(figures[field]) for field in fields}


def store(path: str, key: str, figures: dict[str, float]) -> None:
    """Keep `figures` for `key` beside the other keys' (a new file replaces the old in one rename, so that
    workers starting together never read half a file). A cache that cannot be written is no error."""
    if not path:
        return
    entries = _read(path)
    entries[key] = figures
    folder = os.path.dirname(path) or "."
    try:
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".calibration-")
    except OSError:
        return
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except OSError:
        os.unlink(temporary)
