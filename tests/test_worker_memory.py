"""A worker enforces its memory budget on what kernels allocate and produce, not only on what a plan declares:
a plan lying about its sizes fails its graph with the op,
the sizes and the user's line, while the worker stays under its budget and goes on serving."""
import re

import pytest
import torch

import ravop as R
from ravop.node import Node
from ravop.wire import encode_params, plan_pb2, pack_nodes
from worker import memory
from worker.run import KernelError, run
from worker.validate import check

from helpers import assert_a_valid_graph_runs, upload_subgraph, wait_until_finished

MIB = 2**20
BUDGET = 300 * MIB


def program_of(nodes, outputs):
    sub = plan_pb2.Subgraph(id=0, outputs=outputs)
    pack_nodes(nodes, sub.nodes)
    return check(sub, max_bytes=10 * MIB)


def zeros(node_id, shape, declared, source="user.py:7"):
    return Node(id=node_id, op="zeros", pkey=encode_params({"shape": shape}), shape=declared, dtype=torch.float32,
                   source=source)


def test_an_output_larger_than_declared_fails_at_its_op():
    program = program_of([zeros(1, (64, 64), (1,)), Node(2, "neg", [1], shape=[1], dtype=torch.float32)], [2])
    with pytest.raises(KernelError, match=r"produced \(64, 64\) float32 \(0.0 MiB\) but declared \(1,\)") as info:
        run(program, {}, 0, "cpu", budget=MIB)
    assert info.value.node.id == 1 and info.value.reason == "over memory budget"


def test_a_data_dependent_output_is_bounded_by_the_budget_only():
    found = [zeros(1, (300, 300), (300, 300)), zeros(2, (1,), (1,)),
             Node(3, "find_indices", [1, 2], shape=[1, -1], dtype=torch.int64)]
    assert run(program_of(found, [3]), {}, 0, "cpu", budget=10 * MIB)[3].shape == (1, 90000)
    with pytest.raises(KernelError, match=r"produced \(1, 90000\) int64 \(0.7 MiB\).*budget is 0.5 MiB"):
        run(program_of(found, [3]), {}, 0, "cpu", budget=MIB // 2)


def test_a_failed_allocation_names_the_op_and_the_sizes():
    program = program_of([zeros(1, (4,), (4,))], [1])
    step, declared = program.steps[0], program.declared[1]
    error = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                         "you tried to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)")
    assert memory.allocation_failure(step, declared, error, BUDGET) == (
        "tried to allocate 1,024.0 MiB, over this worker's memory budget of 300.0 MiB (its declared output is (4,) "
        "float32, 0.0 MiB)")
    assert memory.allocation_failure(step, declared, ValueError("bad"), BUDGET) is None


def peak_rss(pid):
    """VmHWM: the most memory the process has had resident."""
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024


@pytest.fixture
def small_values(client):
    """The server takes values of at most 1 MiB (its least proto-max-bulk-len) for one test."""
    old = client.config_get("proto-max-bulk-len")["proto-max-bulk-len"]
    client.config_set("proto-max-bulk-len", MIB)
    yield
    client.config_set("proto-max-bulk-len", old)


def test_lying_plans_fail_and_values_over_one_server_value_are_stored_while_the_worker_stays_under_budget(engine, workers, client,
                                                                                     small_values):
    [name] = workers.start(1, extra=("--max-memory-bytes", str(BUDGET), "--cache-mib", "16"))
    pid = workers.procs[name].pid
    start_peak = peak_rss(pid)
    lying = {  # both declare one float; the first allocates 1 GiB, the second 64 MiB
        "lie-over-budget": zeros(2, (256, 1024, 1024), (1,), source="liar.py:1"),
        "lie-under-budget": zeros(2, (16, 1024, 1024), (1,), source="liar.py:2"),
    }
    keys = {graph_id: upload_subgraph(client, engine.token, graph_id, [node], outputs=[2])
            for graph_id, node in lying.items()}
    for graph_id, k in keys.items():
        assert wait_until_finished(client, k, timeout=60) == b"failed", graph_id
        assert client.hget(k.meta, "error_op") == b"zeros"
        assert client.hget(k.meta, "error_source") == lying[graph_id].source.encode()
    assert client.hget(keys["lie-over-budget"].meta, "error").decode().endswith(
        "tried to allocate 1,024.0 MiB, over this worker's memory budget of 300.0 MiB (its declared output is (1,) "
        "float32, 0.0 MiB)")
    assert client.hget(keys["lie-under-budget"].meta, "error").decode().startswith(
        "produced (16, 1024, 1024) float32 (64.0 MiB) but declared (1,) float32 (0.0 MiB)")

    # An honest graph whose 4 MiB value is more than the server stores in one value: it goes in chunks.
    R.Graph(name="bigger-than-one-value")
    x = R.t(torch.arange(1024.0))
    outer = R.matmul(x.reshape((1024, 1)), x.reshape((1, 1024)))
    outer.persist_op("outer")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=60)
    expected = torch.arange(1024.0)
    assert torch.equal(R.fetch_persisting_op("outer"), torch.outer(expected, expected))

    # The worker is healthy and stayed within its budget throughout.
    assert_a_valid_graph_runs()
    assert workers.alive(name)
    assert peak_rss(pid) - start_peak < BUDGET
