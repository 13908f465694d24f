"""A worker enforces its memory budget on what kernels allocate and produce, not only on what a plan declares:
a plan lying about its sizes fails its graph with the op,
the sizes and the user's line, while the worker stays under its budget and goes on serving."""
import re

import pytest
import torch

import ravop as R
from ravop.core import registry
from ravop.core.loop_template import CarriedSlot, LoopSpec, StepTemplate
from ravop.core.node import Node
from ravop.runtime.loop_run import LoopRun
from ravop.runtime.runner import OpError
from ravop.wire import encode_params, pack_loop, pack_nodes, plan_pb2, unpack_loop
from worker.execute import memory
from worker.execute.run import KernelError, kernel_error, run
from worker.execute.validate import check

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


# ------------------------------------------------------------------------------------------ inside a loop step

def tile(node_id, reads, reps, declared, source):
    return Node(node_id, "tile", [reads], {"reps": reps}, encode_params({"reps": reps}), declared, torch.float32,
                source)


def loop_subgraph(step_op):
    """A loop subgraph carrying one float (const 0) through 3 runs of a step made of `step_op` (node 11, reading
    the carried hole 10): the loop op 1 and its result 2."""
    spec = LoopSpec([StepTemplate([step_op], [CarriedSlot(10, 11)])], n_carried=1, outer_ids=[5],
                    schedule=[(0, 3)], n_steps=3)
    sub = plan_pb2.Subgraph(id=0, device="cpu", inputs=[0], outputs=[2])
    pack_nodes([Node(1, "loop", [0], {"loop": 0}, encode_params({"loop": 0}), ((1,),), (torch.float32,)),
                Node(2, "tuple_get", [1], {"index": 0}, encode_params({"index": 0}), (1,), torch.float32)], sub.nodes)
    pack_loop(spec, sub.loop)
    return sub


def test_an_allocation_failing_in_a_loop_step_names_the_op_its_sizes_the_device_and_the_step(monkeypatch):
    """The runner reports a loop step's kernel error as a subgraph's (`kernel_error`): here torch's CUDA
    out-of-memory error, forced in the tile kernel."""
    def out_of_memory(x, reps):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(registry.REGISTRY["tile"], "kernel", out_of_memory)
    sub = loop_subgraph(tile(11, 10, (4,), (1,), "user.py:3"))
    runner = LoopRun(unpack_loop(sub.loop), [torch.ones(1)], graph_seed=0)
    with pytest.raises(OpError) as info:
        runner.run()
    error = kernel_error(info.value, "cuda:0", BUDGET)
    assert error.reason == "over memory budget" and error.node.source == "user.py:3"
    assert str(error) == ("out of memory on cuda:0 at op 'tile' (inputs (1,) float32): tried to allocate 2.00 GiB, "
                          "over this worker's memory budget of 300.0 MiB (its declared output is (1,) float32, "
                          "0.0 MiB) (loop step 1)")


def test_lying_loop_steps_fail_with_the_op_sizes_and_device_and_the_worker_goes_on(engine, workers, client):
    """A loop step whose op allocates past the budget fails as a plain subgraph's op does (op, sizes, device, the
    user's line, and the loop step), and so does one producing more than it declared; the worker clears what it
    holds and goes on serving."""
    [name] = workers.start(1, extra=("--max-memory-bytes", str(BUDGET), "--cache-mib", "16"))
    lying = {  # both declare one float; the first allocates 1 GiB, the second 64 MiB
        "loop-over-budget": tile(11, 10, (256 * 2**20,), (1,), "liar.py:1"),
        "loop-under-budget": tile(11, 10, (16 * 2**20,), (1,), "liar.py:2"),
    }
    keys = {}
    for graph_id, op in lying.items():
        keys[graph_id] = upload_subgraph(client, engine.token, graph_id, [], inputs=[0], outputs=[2],
                                         constants={0: torch.ones(1)},
                                         stored=loop_subgraph(op).SerializeToString())
    for graph_id, k in keys.items():
        assert wait_until_finished(client, k, timeout=60) == b"failed", graph_id
        assert client.hget(k.meta, "error_op") == b"tile"
        assert client.hget(k.meta, "error_source") == lying[graph_id].source.encode()
    assert client.hget(keys["loop-over-budget"].meta, "error").decode() == (
        "out of memory on cpu at op 'tile' (inputs (1,) float32): tried to allocate 1,024.0 MiB, over this worker's "
        "memory budget of 300.0 MiB (its declared output is (1,) float32, 0.0 MiB) (loop step 1)")
    assert client.hget(keys["loop-under-budget"].meta, "error").decode() == (
        "produced (16777216,) float32 (64.0 MiB) but declared (1,) float32 (0.0 MiB); this worker's memory budget "
        "is 300.0 MiB (loop step 1)")
    assert_a_valid_graph_runs()
    assert workers.alive(name)
