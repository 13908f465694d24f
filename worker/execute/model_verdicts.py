"""The TorchScript archives this machine's workers accepted before, kept between worker processes so that a worker
does not start a sandboxed child (ravop/ops/torchscript_safety.py, 6-15 s under load) for bytes another worker
process of this machine already checked.

The file holds only SHA-256 digests, each of the exact archive bytes checked together with what the check ran
under (the sandbox's limits, torch's version, the checking code itself): `torchscript_safety.check_key`. It holds
nothing that is executed or loaded: a digest read from it only lets bytes that hash to it skip the child, and the
bytes themselves still come from the graph, are checked without torch first and by the allow-list after loading.
Refusals are never written. A file that is not exactly this shape (not JSON, a key missing, one entry that is not a
digest) is ignored as a whole and logged: a partly readable file is not trusted partly.
docs/operators/security.md says why this is safe and what it does not cover.

The file: $RAVOP_MODEL_VERDICTS, else $XDG_CACHE_HOME/ravop/accepted_models.json (~/.cache/...); an empty
$RAVOP_MODEL_VERDICTS turns it off (every worker process checks each model once in its own sandbox)."""
import json
import logging
import os
import re
import tempfile

from ravop.ops import torchscript_safety

VERDICTS_ENV = "RAVOP_MODEL_VERDICTS"
FORMAT = "ravop accepted TorchScript archives: sha256 of check_key and the archive's bytes"
MAX_ACCEPTED = 4096             # digests kept, the oldest dropped first
_DIGEST = re.compile(r"[0-9a-f]{64}")

log = logging.getLogger(__name__)


def default_path() -> str:
    """Where the digests are kept; "" (none kept) when $RAVOP_MODEL_VERDICTS is set empty."""
    if VERDICTS_ENV in os.environ:
        return os.environ[VERDICTS_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ravop", "accepted_models.json")


def share_acceptances() -> None:
    """Set this worker process up to skip the sandbox for models this machine's workers accepted before, and to
    keep what it accepts for the others (ravop-worker at its start); nothing when the file is turned off."""
    path = default_path()
    if path:
        torchscript_safety.remember_accepted(AcceptedModels(path))


class AcceptedModels:
    """The digests in the file at `path`, read again on a miss (another worker process may have added one)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __contains__(self, digest: object) -> bool:
        return digest in self._read()

    def add(self, digest: str) -> None:
        """Keep `digest` beside the others: a new file replaces the old in one rename, so a reader never sees half
        a file. Two workers adding at once may lose one digest (that model is checked again): no error. A file
        that cannot be written is no error either."""
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"not a sha256 hex digest: {digest[:80]!r}")
        accepted = [d for d in self._read() if d != digest][-(MAX_ACCEPTED - 1):] + [digest]
        folder = os.path.dirname(self.path) or "."
        try:
            os.makedirs(folder, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=folder, prefix=".accepted_models-")
        except OSError as exc:
            log.warning("cannot keep the accepted model's digest in %s: %s", self.path, exc)
            return
        try:
            with os.fdopen(handle, "w") as f:
                json.dump({"format": FORMAT, "accepted": accepted}, f)
            os.replace(temporary, self.path)
        except OSError as exc:
            log.warning("cannot keep the accepted model's digest in %s: %s", self.path, exc)
            os.unlink(temporary)

    def _read(self) -> list[str]:
        try:
            with open(self.path) as f:
                text = f.read()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("ignoring the accepted models file %s: %s", self.path, exc)
            return []
        try:
            held = json.loads(text)
            accepted = held["accepted"] if isinstance(held, dict) and held.get("format") == FORMAT else None
        except ValueError:
            accepted = None
        if not isinstance(accepted, list) or not all(isinstance(d, str) and _DIGEST.fullmatch(d) for d in accepted):
            log.warning("ignoring the accepted models file %s: it is damaged (not the digests this worker writes); "
                        "every model is checked in the sandbox again", self.path)
            return []
        return accepted
