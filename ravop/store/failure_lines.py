"""What the command lines (`ravop`, `ravop-worker`) print when a command fails: one line naming what went wrong
and what to check, never a traceback from inside the Redis client. A failure nobody foresaw (a bug) is one
line too, with its kind; RAVOP_TRACEBACK=1 shows its traceback for a report."""
import os
import traceback
from typing import Optional

import redis
from redis.exceptions import RedisClusterException

from ..core.errors import RavopError
from .connect import redact
from .server_replies import first_line


def one_line(exc: BaseException, url: Optional[str] = None) -> str:
    """The message of a command that failed with `exc` against the server at `url` (redacted)."""
    where = f" at {redact(url)}" if url else ""
    if isinstance(exc, RavopError):
        return str(exc).replace("\n", " ")
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return (f"the server{where} refused: {first_line(exc)} (a `ravop admin` user reaches only its own "
                "token's keys: is --token this user's?)")
    if isinstance(exc, redis.AuthenticationError):
        return f"Redis{where} refused the credentials (a wrong password, or the user was revoked): {first_line(exc)}"
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return f"lost Redis{where}: {first_line(exc)}"
    if isinstance(exc, (redis.RedisError, RedisClusterException)):
        return f"the server{where} answered: {first_line(exc)}"
    if isinstance(exc, OSError):
        return first_line(exc)
    if os.environ.get("RAVOP_TRACEBACK"):
        traceback.print_exception(exc)
    return f"unexpected {type(exc).__name__}: {first_line(exc)} (RAVOP_TRACEBACK=1 shows where)"
