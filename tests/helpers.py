"""Plain helpers shared by test modules (fixtures live in conftest.py)."""
import threading
import time
import uuid
from contextlib import contextmanager

import torch

import ravop as R
from ravop.store import Scripts, connect, graphs
from ravop.wire import pack_nodes, plan_pb2


def run_ops(ops, timeout=300):
    """Persist `ops`, run the current graph on the workers, and fetch their values, in order."""
    for i, op in enumerate(ops):
        op.persist_op(f"value_{i}")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)
    return [R.fetch_persisting_op(f"value_{i}") for i in range(len(ops))]


def upload_subgraph(client, token, graph_id, nodes, inputs=(), outputs=(), constants=None, stored=None):
    """A hand-written plan of one subgraph, uploaded and started as R.activate()/R.execute() would; with
    `stored`, those bytes replace the subgraph's plan before the start."""
    plan = plan_pb2.Plan(graph_id=graph_id)
    sub = plan.subgraphs.add(id=0, device="cpu", inputs=inputs, outputs=outputs)
    pack_nodes(nodes, sub.nodes)
    keys = graphs.upload(client, token, plan, constants or {}, {"name": graph_id})
    if stored is not None:
        client.hset(keys.subgraphs, 0, stored)
    Scripts(client).start(keys)
    return keys


def wait_until_finished(client, keys, timeout=120):
    """The graph's final state (b"done" or b"failed"), polled; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (state := client.hget(keys.meta, "state")) in (b"running", b"activated"):
        assert time.monotonic() < deadline, f"graph {keys.graph_id} still {state.decode()} after {timeout} s"
        time.sleep(0.02)
    return state


def assert_a_valid_graph_runs():
    """A small valid graph runs on the workers and gives the exact result: they survived what came before."""
    R.Graph(name="after")
    x = R.t(torch.ones(100, 100))
    (x @ x).persist_op("good")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    assert torch.equal(R.fetch_persisting_op("good"), torch.full((100, 100), 100.0))


def on_one_thread(function, *args):
    """`function(*args)` on one torch thread, as the test workers run: an in-process reference that a
    multi-threaded reduction would sum in another order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return function(*args)
    finally:
        torch.set_num_threads(threads)


def wait_for(condition, what, timeout=120):
    """`condition()`'s first truthy value, polled every 10 ms; fails the test after `timeout` s naming `what`."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return found


@contextmanager
def commands_seen(url):
    """The list of every command the server at `url` receives (MONITOR, as text) while the block runs."""
    seen, started, stop = [], threading.Event(), f"end-of-watch-{uuid.uuid4().hex}"

    def monitor():
        with connect(url).monitor() as stream:
            started.set()
            for command in stream.listen():
                seen.append(command["command"])
                if stop in command["command"]:
                    return

    thread = threading.Thread(target=monitor, daemon=True)
    thread.start()
    started.wait(10)
    yield seen
    connect(url).echo(stop)
    thread.join(30)
    assert not thread.is_alive(), "the MONITOR connection did not see the end of the watched commands"
