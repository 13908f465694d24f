"""Where the last embedded session of this user can be found, so that `ravop status` (and the other
commands) run in another terminal without a URL reach it: a small JSON file under the user's runtime
directory ($XDG_RUNTIME_DIR, else ~/.cache) naming the server's URL, the token and the owning process."""
import json
import os
from pathlib import Path


def _path():
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ravop" / "last-embedded.json"


def remember(url, token):
    """Record the embedded session this process runs (written atomically: a reader never sees half)."""
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps({"url": url, "token": token, "pid": os.getpid()}))
    os.replace(temp, path)


def recall():
    """{'url', 'token', 'pid'} of the last embedded session started by this user, or None."""
    try:
        return json.loads(_path().read_text())
    except (OSError, ValueError):
        return None
