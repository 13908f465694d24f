"""Watchers of a graph: objects that follow a graph while `R.track_progress()` waits on it (ravdl's fit
callbacks register one per fit). The requester is the one who watches: the workers never wait for a watcher,
which sees what they persisted at each poll.

A watcher has `poll(client, keys, state)`, called at every refresh of the tracker (it decides itself how often
to read anything), and `ended(client, keys, state)`, called once when the graph has ended (done, failed or
cancelled). A watcher that wants the training to end early asks for a stop (`ravop.tools.status.request_stop`): the
graph then ends done, its loops having stopped at an epoch boundary."""
from typing import Any, Dict, List

_watchers: Dict[str, List[Any]] = {}   # graph id -> watchers, in the order they were added


def watch(graph_id: str, watcher: Any) -> None:
    _watchers.setdefault(graph_id, []).append(watcher)


def of(graph_id: str) -> List[Any]:
    """The watchers of a graph (a copy)."""
    return list(_watchers.get(graph_id, ()))


def forget(graph_id: str) -> None:
    """Drop a graph's watchers once it has ended and they were told."""
    _watchers.pop(graph_id, None)
