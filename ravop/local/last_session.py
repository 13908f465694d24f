"""Where this user's embedded sessions can be found, so that `ravop status` (and the other commands) run in
another terminal without a URL reach one: a small JSON file per session under the user's runtime directory
($XDG_RUNTIME_DIR, else ~/.cache) naming the server's URL, the token and the owning process.

`recall` gives the newest session whose process still runs: a short script that started (and ended) after a
long one must not hide the long one, which is the one a user looks at."""
import json
import os
import time
from pathlib import Path


def _folder():
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ravop" / "embedded-sessions"


def remember(url, token):
    """Record the embedded session this process runs (written atomically: a reader never sees half)."""
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.getpid()}.json"
    temp = path.with_name(f"{path.name}.tmp")
    temp.write_text(json.dumps({"url": url, "token": token, "pid": os.getpid(), "started": time.time()}))
    os.replace(temp, path)


def forget():
    """This process's embedded session has ended."""
    try:
        (_folder() / f"{os.getpid()}.json").unlink()
    except OSError:
        pass


def _alive(session):
    """Its process runs and, for a unix socket, the socket is still there (a reused pid has none)."""
    try:
        os.kill(int(session["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, TypeError, ValueError):
        return False
    url = str(session.get("url", ""))
    return not url.startswith("unix://") or os.path.exists(url[len("unix://"):].split("?")[0])


def recall():
    """{'url', 'token', 'pid', 'started'} of the newest embedded session of this user that still runs, or None.
    The records of sessions that ended without saying so (killed) are removed on the way."""
    sessions = []
    for path in _folder().glob("*.json"):
        try:
            session = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _alive(session):
            sessions.append(session)
        else:
            try:
                path.unlink()
            except OSError:
                pass
    return max(sessions, key=lambda s: s.get("started", 0), default=None)
