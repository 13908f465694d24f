"""Exceptions raised by ravop. Every error names the problem; op errors also name the user's source line."""


class RavopError(Exception):
    """Base class of every error this library raises on purpose."""


class ShapeError(RavopError, ValueError):
    """An op was recorded with inputs whose shapes or dtypes it cannot take."""


class GraphStateError(RavopError, RuntimeError):
    """The call does not fit the graph's state (no graph, already activated, not activated, ...)."""


class GraphFailedError(RavopError, RuntimeError):
    """A subgraph failed on a worker; the message names the op, its error, the worker and the source line."""
    # The same, one field each, where the failure recorded them (ravop.client.stored_values.failure).
    op: "str | None" = None
    error: "str | None" = None
    worker: "str | None" = None
    source: "str | None" = None
    subgraph: "str | None" = None


class GraphCancelledError(GraphFailedError):
    """Its requester cancelled the graph (`ravop cancel`, the dashboard); the message names who, and why."""


class DeviceUnavailable(RavopError, RuntimeError):
    """A graph or session asks for a device (a GPU) that nothing started by this session can provide."""


class NotComputedError(RavopError, LookupError):
    """A persisted op exists but its value has not been computed yet."""


class UnknownPersistName(RavopError, KeyError):
    """No op was persisted under this name in the current graph."""

    def __str__(self):  # KeyError would repr() the message and add quotes
        return str(self.args[0]) if self.args else ""


class ConnectionFailed(RavopError, ConnectionError):
    """The Redis server could not be reached."""


class WireFormatError(RavopError, ValueError):
    """Bytes from Redis do not decode to a valid tensor, plan or message."""


class PlanError(RavopError, ValueError):
    """A subgraph read from Redis is malformed, names an unknown op, or exceeds a worker's limits."""

    def __init__(self, message, node=None):
        super().__init__(message)
        self.node = node  # the plan node at fault, if one is


class StoreLimitError(RavopError, ValueError):
    """Values to write do not fit the Redis server's limits (maxmemory, proto-max-bulk-len)."""


class QuotaError(RavopError, RuntimeError):
    """A token is past a quota its admin set (`ravop admin token set`): the message names the quota and the token."""


class UploadIncompleteError(RavopError, RuntimeError):
    """A big constant's upload stopped before it was complete: its requester died, or the graph ended first
    (ravop.store.background_upload)."""
