"""What goes wrong on a worker surfaces on the requester with the op, the error, the worker and the user's
line, and never kills the worker: kernel errors, hostile messages and plans, retries exhausted, work for a
device nobody serves."""
import inspect

import pytest
import torch

import ravop as R
from ravop.core.node import Node
from ravop.runtime.evaluate import OpError, evaluate
from ravop.store import DEAD_LETTER, GROUP, Scripts, queue
from ravop.wire import plan_pb2

from helpers import assert_a_valid_graph_runs, upload_subgraph, wait_for


def dead_letters(client, graph_id):
    return [fields for _, fields in client.xrange(DEAD_LETTER) if fields[b"graph"] == graph_id.encode()]


def dead_letters_after_failure(client, graph_id):
    """The graph's dead letters once there are any: a worker fails the graph first and dead-letters its message
    next (ravop.store.scripts `fail`), so a tracker may see the failure a moment before the entry."""
    return wait_for(lambda: dead_letters(client, graph_id), f"a dead letter of graph {graph_id}")


def test_kernel_error_surfaces_with_op_and_source_line(engine, workers, client):
    [name] = workers.start(1)
    R.Graph(name="singular")
    singular = R.t(torch.zeros(80, 80))  # too big to fold: the worker runs it
    line = inspect.currentframe().f_lineno + 1
    inverse = R.inv(singular)
    (inverse + 1.0).persist_op("inverse")
    R.activate()
    R.execute()
    with pytest.raises(R.GraphFailedError) as info:
        R.track_progress(progress_bar=False, timeout=120)
    message = str(info.value)
    assert "op 'inv'" in message and f"test_worker_failures.py:{line}" in message and name in message
    assert "singular" in message  # torch's own words
    assert (info.value.op, info.value.worker) == ("inv", name)
    # evaluate(), in this process, names the op and line in the same words the worker used
    with pytest.raises(OpError) as local:
        evaluate(inverse)
    assert local.value.node.op == "inv" and f"test_worker_failures.py:{line}" in str(local.value)
    assert f"{local.value}" in message.replace(f" on worker {name}", "")
    with pytest.raises(R.GraphFailedError, match="op 'inv'"):
        R.fetch_persisting_op("inverse")
    [dead] = dead_letters_after_failure(client, engine.graph_id)  # failed once, not retried
    assert dead[b"reason"] == b"kernel error" and dead[b"op"] == b"inv"
    assert workers.alive(name)


def test_hostile_messages_and_plans_do_not_kill_the_worker(engine, workers, client):
    [name] = workers.start(1)
    token = engine.token
    stream = queue("cpu")
    client.xadd(stream, {b"\xff\x00": b"\x13garbage"})
    client.xadd(stream, {"token": "../../etc", "graph": "g", "subgraph": "0"})
    client.xadd(stream, {"token": token, "graph": "nosuch", "subgraph": "0"})  # a graph flushed long ago
    ones = {1: torch.ones(2)}
    uneven = plan_pb2.Subgraph(id=0, device="cpu", outputs=[2])   # two ids, one op name, inputs that are not there
    uneven.nodes.id.extend([2, 3])
    uneven.nodes.op.append("neg")
    uneven.nodes.n_inputs.extend([1, 10**9])
    hostile = {
        "unknown-op": dict(nodes=[Node(id=2, op="os.system", inputs=[1])], inputs=[1], outputs=[2],
                           constants=ones),
        "huge-shape": dict(nodes=[Node(id=2, op="zeros", shape=[10**12, 10**6], dtype=torch.float32,
                                          pkey=b'{"shape":[1000000000000,1000000]}')], outputs=[2]),
        "lying-shape": dict(nodes=[Node(id=2, op="zeros", shape=[1], dtype=torch.float32,
                                           pkey=b'{"shape":[1000000000000,1000000]}')], outputs=[2]),
        "undefined-input": dict(nodes=[Node(id=3, op="add", inputs=[1, 2])], inputs=[1], outputs=[3],
                                constants=ones),
        "bad-params": dict(nodes=[Node(id=2, op="neg", inputs=[1], pkey=b"{not json")], inputs=[1],
                           outputs=[2], constants=ones),
        "deep-params": dict(nodes=[Node(id=2, op="neg", inputs=[1], pkey=b'{"a":' + b"[" * 5000 + b"]" * 5000
                                           + b"}")], inputs=[1], outputs=[2], constants=ones),
        "huge-params": dict(nodes=[Node(id=2, op="neg", inputs=[1], pkey=b'{"a":"' + b"x" * (17 << 20) + b'"}')],
                            inputs=[1], outputs=[2], constants=ones),
        "odd-params": dict(nodes=[Node(id=2, op="index", inputs=[1], pkey=b'{"spec":[["t"]]}', source="odd.py:3")],
                           inputs=[1], outputs=[2], constants=ones),
        "garbage-plan": dict(nodes=[], outputs=[], stored=b"\x00garbage protobuf\xff"),
        "uneven-columns": dict(nodes=[], outputs=[], stored=uneven.SerializeToString()),
    }
    keys = {graph_id: upload_subgraph(client, token, graph_id, **spec) for graph_id, spec in hostile.items()}

    assert_a_valid_graph_runs()
    assert workers.alive(name)

    errors = {graph_id: client.hget(k.meta, "error").decode() for graph_id, k in keys.items()}
    assert all(client.hget(k.meta, "state") == b"failed" for k in keys.values()), errors
    assert "unknown op 'os.system'" in errors["unknown-op"]
    assert "over this worker's limit" in errors["huge-shape"]
    assert "over this worker's memory budget" in errors["lying-shape"]  # torch refuses; the worker goes on
    assert errors["deep-params"] == "op 'neg': op params nest deeper than 32 levels"
    assert errors["huge-params"] == "op 'neg': op params are 17,825,800 bytes, more than the 16,777,216 allowed"
    assert errors["odd-params"] == "StopIteration with no message, raised by the kernel with spec=(('t',),)"
    assert "reads values [2]" in errors["undefined-input"]
    assert "not valid JSON" in errors["bad-params"]
    assert "not a valid plan" in errors["garbage-plan"]
    assert "node columns disagree" in errors["uneven-columns"]
    malformed = [f for _, f in client.xrange(DEAD_LETTER) if f[b"reason"] == b"malformed message"]
    assert len(malformed) >= 2
    assert all(len(dead_letters(client, graph_id)) == 1 for graph_id in hostile)
    assert client.xlen(stream) == 0  # every message was acked and removed


def test_gives_up_after_max_attempts_naming_the_last_worker(engine, workers, client):
    R.Graph(name="cursed")
    x = R.t(torch.ones(100, 100))
    line = inspect.currentframe().f_lineno + 1
    (x @ x).persist_op("p")
    R.activate()
    R.execute()
    # What workers that die while running a subgraph leave behind: a consumer ("ghost") that claimed the
    # message and started the subgraph, and never acks; each re-claim counts one more delivery.
    keys = engine.keys()
    reply = client.xreadgroup(GROUP, "ghost", {queue("cpu"): ">"}, count=100)
    [message_id] = [mid for mid, f in reply[0][1] if f[b"graph"] == keys.graph_id.encode()]
    Scripts(client).claim(keys, 0, "ghost")
    for _ in range(2):
        client.xclaim(queue("cpu"), GROUP, "ghost", 0, [message_id])
    workers.start(1, reclaim_idle=0.5, max_attempts=3)
    with pytest.raises(R.GraphFailedError, match="delivered 4 times") as info:
        R.track_progress(progress_bar=False, timeout=120)
    assert "ghost" in str(info.value) and f"test_worker_failures.py:{line}" in str(info.value)
    [dead] = dead_letters_after_failure(client, keys.graph_id)
    assert dead[b"reason"] == b"too many deliveries"
    client.xgroup_delconsumer(queue("cpu"), GROUP, "ghost")


def test_cpu_workers_leave_gpu_work_alone(engine, workers, client, capsys):
    workers.start(1)
    R.Graph(name="gpu", gpu_required="yes")
    x = R.t(torch.ones(100, 100))
    (x @ x).persist_op("p")
    R.activate()
    R.execute()
    with pytest.raises(TimeoutError, match="no GPU worker is running"):
        R.track_progress(timeout=3)
    assert "waiting for a GPU worker" in capsys.readouterr().err
    keys = engine.keys()
    assert client.hget(keys.meta, "ops_done") == b"0"
    assert client.xpending(queue("cuda"), GROUP)["pending"] == 0  # nobody took it
    assert any(f[b"graph"] == keys.graph_id.encode() for _, f in client.xrange(queue("cuda")))
    with pytest.raises(R.NotComputedError):
        R.fetch_persisting_op("p")
