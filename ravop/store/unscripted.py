"""A `ravop admin` token user may not run scripts (ravop.store.access): what a requester does with a script
it then does without one (more round trips), and a client remembers the refusal, so that it is asked once."""
from typing import Callable, TypeVar

import redis

from .client_types import Client

T = TypeVar("T")
_REFUSED = "_ravop_scripts_refused"


def refused(client: Client) -> bool:
    """Whether `client`'s user was refused a script already."""
    return bool(getattr(client, _REFUSED, False))


def scripted_or_not(client: Client, scripted: Callable[[], T], unscripted: Callable[[], T]) -> T:
    """`scripted()`, or `unscripted()` if the user may not run scripts."""
    if not refused(client):
        try:
            return scripted()
        except redis.exceptions.NoPermissionError as exc:
            if "script" not in str(exc) and "eval" not in str(exc):
                raise   # a key it may not touch: the script is not the question
            setattr(client, _REFUSED, True)
    return unscripted()
