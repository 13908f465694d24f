"""Redundant execution, `R.Graph(verify=k)`: each subgraph runs on k distinct workers whose outputs must
agree bit for bit. With honest workers the results are those of an unverified run; a worker that computes
wrong results (`ravop-worker --test-wrong-outputs`) fails the graph, named, and once outvoted by a majority
gets no more of that requester's work."""
import pytest
import torch

import ravop as R
from compiler.cost import DEVICES
from ravop.store import TokenKeys, votes


def two_branches(verify):
    """Two independent matmul branches (two subgraphs) and their sum (a third)."""
    R.Graph(name=f"verified-{verify}", verify=verify)
    generator = torch.Generator().manual_seed(1)
    left, right = (R.t(torch.rand(384, 384, generator=generator) / 384) for _ in range(2))
    for _ in range(4):
        left, right = R.tanh(left @ left), R.tanh(right @ right)
    (left @ right).persist_op("out")
    # The fixed cost figures, not the workers' own: on a fast machine these small branches would make one subgraph.
    summary = R.activate(devices=DEVICES)
    assert summary["subgraphs"] >= 2   # the branches run apart, on whichever workers take them
    R.execute()
    return summary


def test_honest_workers_agree_and_give_the_unverified_result(engine, workers, client):
    names = workers.start(2)
    two_branches(1)
    R.track_progress(progress_bar=False, timeout=120)
    plain = R.fetch_persisting_op("out")
    summary = two_branches(2)
    R.track_progress(progress_bar=False, timeout=120)
    assert torch.equal(R.fetch_persisting_op("out"), plain)
    keys = engine.keys()
    for sid in range(summary["subgraphs"]):
        cast = votes.read(client, keys, sid)
        assert sorted(w.decode() for w in cast) == sorted(names) and len(set(cast.values())) == 1


def test_a_wrong_worker_is_named_outvoted_and_banned(engine, workers, client):
    honest = workers.start(2)
    [liar] = workers.start(1, extra=["--test-wrong-outputs"], prefix="liar")
    two_branches(3)
    with pytest.raises(R.GraphFailedError, match="verification failed") as failed:
        R.track_progress(progress_bar=False, timeout=120)
    message = str(failed.value)
    assert f"{', '.join(sorted(honest))} agree; {liar} differ" in message and failed.value.worker == liar
    assert client.smembers(TokenKeys(engine.token).banned) == {liar.encode()}

    summary = two_branches(2)   # the liar is still connected, but gets none of this requester's work
    R.track_progress(progress_bar=False, timeout=120)
    keys = engine.keys()
    assert all(set(votes.read(client, keys, sid)) == {n.encode() for n in honest}
               for sid in range(summary["subgraphs"]))
    assert liar.encode() not in set(client.hvals(keys.ran))
    assert workers.alive(liar)


def test_two_workers_that_disagree_fail_the_graph_with_no_one_banned(engine, workers, client):
    [honest] = workers.start(1)
    [liar] = workers.start(1, extra=["--test-wrong-outputs"], prefix="liar")
    two_branches(2)
    with pytest.raises(R.GraphFailedError, match=f"no majority among {', '.join(sorted([honest, liar]))}"):
        R.track_progress(progress_bar=False, timeout=120)
    assert not client.exists(TokenKeys(engine.token).banned)


def test_verify_is_checked():
    with pytest.raises(ValueError, match="verify must be a positive int"):
        R.Graph(verify=0)
    with pytest.raises(ValueError, match="does not apply to a federated graph"):
        R.Graph(approach="federated", rules='{"rules": {"age": {}}, "max_clients": 1}', verify=2)
