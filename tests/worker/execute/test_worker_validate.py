"""The worker's checks of a plan read from Redis, and its tensor cache (no server needed)."""
import pytest
import torch

from ravop.core.errors import PlanError
from ravop.core.node import Node
from ravop.wire import encode_params, pack_nodes, plan_pb2
from worker.execute.cache import TensorCache
from worker.execute.run import KernelError, run
from worker.execute.validate import check

MIB = 2**20


def subgraph(nodes, inputs=(), outputs=()):
    sub = plan_pb2.Subgraph(id=0, inputs=inputs, outputs=outputs)
    pack_nodes(nodes, sub.nodes)
    return sub


def neg(id, x, n=MIB // 4):
    return Node(id=id, op="neg", inputs=[x], shape=[n], dtype=torch.float32, source=f"user.py:{id}")


def test_peak_memory_counts_values_alive_at_once():
    # 1 -> 2 -> 3 -> 4, each 1 MiB: at most an input and an output are alive at once
    program = check(subgraph([neg(2, 1), neg(3, 2), neg(4, 3)], inputs=[1], outputs=[4]), max_bytes=10 * MIB)
    assert program.peak_bytes == 2 * MIB
    assert program.last_use == {1: 0, 2: 1, 3: 2}
    # 2 is also an output: kept to the end, so three values are alive at the last op
    program = check(subgraph([neg(2, 1), neg(3, 2), neg(4, 3)], inputs=[1], outputs=[2, 4]), max_bytes=10 * MIB)
    assert program.peak_bytes == 3 * MIB and 2 not in program.last_use


def test_a_plan_over_the_limit_is_refused_at_the_op_that_crosses_it():
    with pytest.raises(PlanError, match="over this worker's limit") as info:
        check(subgraph([neg(2, 1), neg(3, 2, n=10 * MIB)], inputs=[1], outputs=[3]), max_bytes=8 * MIB)
    assert info.value.node.id == 3 and info.value.node.source == "user.py:3"


@pytest.mark.parametrize("nodes, inputs, outputs, message", [
    ([Node(id=2, op="eval", inputs=[1])], [1], [2], "unknown op 'eval'"),
    ([Node(id=2, op="const")], [], [2], "unknown op 'const'"),
    ([neg(2, 7)], [1], [2], r"reads values \[7\]"),
    ([neg(2, 1), neg(2, 1)], [1], [2], "defined twice"),
    ([neg(2, 1)], [1], [5], r"outputs \[5\] are not computed"),
    ([Node(id=2, op="neg", inputs=[1], shape=[-5], dtype=torch.float32)], [1], [2], "negative dimension"),
    ([Node(id=2, op="neg", inputs=[1], pkey=b"[1, 2]")], [1], [2], "must be a JSON object"),
])
def test_malformed_plans_are_refused(nodes, inputs, outputs, message):
    with pytest.raises(PlanError, match=message):
        check(subgraph(nodes, inputs, outputs), max_bytes=MIB)


def test_an_unknown_dtype_name_is_refused():
    sub = subgraph([neg(2, 1)], [1], [2])
    sub.nodes.dtype[0] = "float128"
    with pytest.raises(PlanError, match="op 'neg' declares unknown dtype 'float128'"):
        check(sub, max_bytes=MIB)


def test_run_frees_intermediates_keeps_outputs_and_names_a_failing_op():
    nodes = [neg(2, 1, n=3), Node(id=3, op="add", inputs=[2, 2], shape=[3], dtype=torch.float32),
             neg(4, 3, n=3)]
    program = check(subgraph(nodes, inputs=[1], outputs=[4]), max_bytes=MIB)
    assert torch.equal(run(program, {1: torch.ones(3)}, 0, "cpu", MIB)[4], torch.full((3,), 2.0))
    bad = Node(id=2, op="reshape", inputs=[1], pkey=encode_params({"shape": (7,)}), source="u.py:9")
    program = check(subgraph([bad], inputs=[1], outputs=[2]), max_bytes=MIB)
    with pytest.raises(KernelError, match="RuntimeError") as info:
        run(program, {1: torch.ones(3)}, 0, "cpu", MIB)
    assert info.value.node.source == "u.py:9"


def test_cache_evicts_least_recently_used_by_bytes():
    cache = TensorCache(max_bytes=3 * 400)
    for key in "abc":
        cache.put(key, torch.zeros(100))  # 400 bytes each
    assert cache.get("a") is not None  # now b is the least recently used
    cache.put("d", torch.zeros(100))
    assert cache.get("b") is None and all(cache.get(k) is not None for k in "acd")
    cache.put("huge", torch.zeros(1000))  # larger than the whole cache: not kept, nothing evicted
    assert cache.get("huge") is None and cache.bytes == 1200
