"""Find a graph of a token by what a user types: its id, or its name (the newest graph of that name)."""
from ..core.errors import RavopError
from .client_types import Client
from .keys import GraphKeys, TokenKeys


class GraphNotFound(RavopError, LookupError):
    pass


def find_graph(client: Client, token: str, ref: str) -> GraphKeys:
    """GraphKeys of the token's graph whose id is `ref`, else of the newest one named `ref`."""
    ids = [gid.decode() for gid in client.zrevrange(TokenKeys(token).graphs, 0, -1)]
    if ref in ids:
        return GraphKeys(token, ref)
    pipe = client.pipeline(transaction=False)
    for gid in ids:
        pipe.hget(GraphKeys(token, gid).meta, "name")
    for gid, name in zip(ids, pipe.execute()):
        if name is not None and name.decode() == ref:
            return GraphKeys(token, gid)
    raise GraphNotFound(f"token {token!r} has no graph with id or name {ref!r} "
                        f"({len(ids)} graph{'s' if len(ids) != 1 else ''}: see `ravop graphs`)")
