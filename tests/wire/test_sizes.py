"""Hostile and oversized sizes refused with the numbers, before they cost a worker memory or time: a forged
chunked-tensor header (against the worker's budget and the chunks stored, before any chunk is read), a plan
over the size limit (at upload and on a worker), memory returned to the OS after a failed subgraph (measured),
and the default memory budget shared among the workers of one machine."""
import os
import re
import struct

import pytest
import torch

import ravop as R
from ravop.core.errors import GraphFailedError, PlanError
from ravop.core.node import Node
from ravop.store import GraphKeys, worker_info
from ravop.store.tensors import chunks_key
from ravop.wire import pack_nodes, plan_pb2
from ravop.wire.codec import CHUNKED_MAGIC, encode_chunked

from helpers import upload_subgraph, wait_for, wait_until_finished

MACHINE = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


FLOAT32 = encode_chunked(torch.ones(1), 4)[0][4]   # the codec's dtype code


def forged_header(shape, chunk_bytes, n_chunks):
    """A chunked float32 header declaring `shape` in `n_chunks` chunks of `chunk_bytes` (ravop.wire.codec)."""
    return CHUNKED_MAGIC + struct.pack(f"<BB{len(shape)}Q", FLOAT32, len(shape), *shape) + struct.pack("<QI", chunk_bytes,
                                                                                                  n_chunks)


def test_a_forged_chunked_header_is_refused_before_any_chunk_is_read(engine, workers, client):
    workers.start(1, extra=["--max-memory-bytes", str(512 * 2**20)])
    header, _ = encode_chunked(torch.ones(4), 4)
    assert forged_header((4,), 4, 4) == header   # forged as the codec writes them
    cases = {   # graph id -> (header, chunks stored, what the refusal says)
        "huge": (forged_header((25_000, 1_000_000), 4 * 2**20, 23_842), 0,
                 "declares (25000, 1000000) float32 (95,367.4 MiB), over this reader's memory budget of 512.0 MiB"),
        "many": (forged_header((2**20 * 16,), 64, 2**20), 3,
                 "declares 1048576 chunks of 64 bytes (67108864 in all) but 3 are stored"),
    }
    graphs = {}
    for graph_id, (data, stored, _) in cases.items():
        keys = GraphKeys(engine.token, graph_id)
        client.set(keys.tensor(1), data)
        for index in range(stored):
            client.hset(chunks_key(keys.tensor(1)), index, b"x" * 64)
        graphs[graph_id] = upload_subgraph(client, engine.token, graph_id, [Node(id=2, op="neg", inputs=[1])],
                                           inputs=[1], outputs=[2])
    for graph_id, (_, _, says) in cases.items():
        keys = graphs[graph_id]
        assert wait_until_finished(client, keys) == b"failed"
        error = client.hget(keys.meta, "error").decode()
        assert says in error, error


def big_plan(n_nodes):
    """A valid one-subgraph plan of `n_nodes` nodes (a chain of negations of input 1)."""
    sub = plan_pb2.Subgraph(id=0, device="cpu", inputs=[1], outputs=[n_nodes + 1])
    pack_nodes([Node(id=i + 2, op="neg", inputs=[i + 1]) for i in range(n_nodes)], sub.nodes)
    return sub


def test_a_plan_over_the_limits_is_refused_at_upload_and_by_a_worker(engine, workers, client, monkeypatch):
    monkeypatch.setenv("RAVOP_MAX_SUBGRAPH_NODES", "5")
    R.Graph(name="too-long")
    x = R.t(torch.rand(128, 128))   # too big to be folded at activate; no repeated step to make a loop of
    y = R.exp(-x)
    z = R.exp(y) * R.tanh(x) + R.sqrt(R.abs(y - x))
    (R.softmax(z, axis=1) @ x).persist_op("x")
    with pytest.raises(PlanError, match=r"has [\d,]+ nodes, more than the 5 allowed \(\$RAVOP_MAX_SUBGRAPH_NODES\)"):
        R.activate()
    # A worker's own limits (it inherits these), below what the requester here allows: plans forged past them.
    monkeypatch.setenv("RAVOP_MAX_SUBGRAPH_NODES", "100")
    monkeypatch.setenv("RAVOP_MAX_PLAN_BYTES", "5000")
    workers.start(1)
    monkeypatch.delenv("RAVOP_MAX_SUBGRAPH_NODES")
    monkeypatch.delenv("RAVOP_MAX_PLAN_BYTES")
    plans = {"long": big_plan(200), "big": big_plan(600)}
    assert plans["long"].ByteSize() < 5000 < plans["big"].ByteSize()
    graphs = {graph_id: upload_subgraph(client, engine.token, graph_id, [Node(id=2, op="neg", inputs=[1])],
                                        inputs=[1], outputs=[2], constants={1: torch.ones(2)},
                                        stored=plan.SerializeToString()) for graph_id, plan in plans.items()}
    assert all(wait_until_finished(client, keys) == b"failed" for keys in graphs.values())
    assert client.hget(graphs["long"].meta, "error") == b"subgraph 0 has 200 nodes, more than the 100 allowed " \
        b"($RAVOP_MAX_SUBGRAPH_NODES): run the work as a loop (ravop.record.loop) or in several graphs"
    assert client.hget(graphs["big"].meta, "error").startswith(
        f"subgraph 0's plan is {plans['big'].ByteSize():,} bytes, more than the 5,000 allowed".encode())


def test_a_worker_returns_memory_to_the_os_after_an_over_budget_failure(engine, workers, client):
    # A subgraph declaring 60 values of 16 MiB alive at once (under the 4 GiB it may declare) in a worker whose
    # process may take 700 MiB: an allocation fails part way, after hundreds of MiB were taken.
    [name] = workers.start(1, extra=["--max-subgraph-bytes", str(4 * 2**30), "--max-memory-bytes",
                                     str(700 * 2**20), "-v"])
    R.Graph(name="over-budget")
    x = R.t(torch.ones(2048, 2048))
    values = [x * float(i + 2) for i in range(60)]
    total = values[0]
    for value in values[1:]:
        total = total + value
    total.persist_op("total")
    R.activate()
    R.execute()
    with pytest.raises(GraphFailedError, match="memory"):
        R.track_progress(progress_bar=False)
    line = wait_for(lambda: re.search(r"RSS ([\d,.]+) MiB after a failed subgraph, ([\d,.]+) MiB once its values "
                                      r"were collected, ([\d,.]+) MiB after returning", workers.log(name)),
                    "the worker to log its RSS")
    before, collected, after = (float(v.replace(",", "")) for v in line.groups())
    print(f"\nworker RSS after the failure: {before:,.1f} MiB; {collected:,.1f} MiB after gc.collect(); "
          f"{after:,.1f} MiB after malloc_trim(0)")
    assert after < before
    advertised = wait_for(lambda: next((w["rss"] for w in worker_info.read_all(client) if w["name"] == name and
                                        w.get("rss") and w["rss"] < before * 2**20), None), "a lower RSS advertised")
    assert advertised < before * 2**20
    assert workers.alive(name)


def test_the_default_memory_budget_is_a_share_of_the_machine(engine, workers, client):
    def limit(name):
        return next(w["memory_limit"] for w in worker_info.read_all(client) if w["name"] == name)
    [quarter] = workers.start(1, extra=["--workers-on-machine", "4"])
    assert limit(quarter) == MACHINE // 4 // 2
    first = workers.start(1)   # counts the live workers on this host: itself and the one above at least
    [third] = workers.start(1)
    assert limit(third) <= MACHINE // 3 // 2 and limit(first[0]) <= MACHINE // 2 // 2
