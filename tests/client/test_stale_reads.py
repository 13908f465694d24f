"""A read of "the current graph" (R.fetch_persisting_op(name), R.fetch_losses(), R.track_progress()) before that
graph is activated is refused, naming the graph, instead of answering for the token's last activated graph (an
earlier graph of the same script, or another script's graph kept in the embedded snapshot: a stale tensor with
no error, a tracker that "finished" a graph never started; issue 40). A process that records nothing still reads
the token's last activated graph (README, "First two machines": the requester may exit after R.execute()), and a
finished graph's values stay fetchable, by default until the next graph is started, and by graph= always."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ravop as R
from ravop.core.errors import GraphStateError
from ravop.record.graph import set_current

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def run_graph(name, values, timeout=120):
    """A graph `name` persisting `values` * 2 under "y" (too big to fold: a worker computes it), run to its end."""
    graph = R.Graph(name=name)
    (R.t(torch.as_tensor(values).repeat(40, 1)) @ R.t(torch.eye(len(values)) * 2)).persist_op("y")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)
    return graph


def twice(values):
    return (torch.as_tensor(values) * 2).repeat(40, 1)


def test_a_fetch_before_the_next_graph_is_activated_is_refused_not_answered_by_the_last_graph(engine, module_workers):
    first = run_graph("first", [1.0, 2.0])
    assert torch.equal(R.fetch_persisting_op("y"), twice([1.0, 2.0]))   # after it finished
    R.Graph(name="second")
    (R.t(torch.full((40, 2), 10.0)) @ R.t(torch.eye(2) * 2)).persist_op("y")   # the same persist name
    for read in (lambda: R.fetch_persisting_op("y"), lambda: R.fetch_persisting_op("y", wait=True, timeout=5),
                 R.fetch_losses):
        with pytest.raises(GraphStateError, match=r"graph 'second' \(id \w+\) is not activated.*"
                                                  r"call R.activate\(\) and R.execute\(\) first"):
            read()
    assert torch.equal(R.fetch_persisting_op("y", graph=first), twice([1.0, 2.0]))   # asked for by name: fine
    assert torch.equal(R.fetch_persisting_op("y", graph="first"), twice([1.0, 2.0]))
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    assert torch.equal(R.fetch_persisting_op("y"), torch.full((40, 2), 20.0))


def test_ops_recorded_without_a_graph_are_the_current_graph_too(engine, module_workers):
    run_graph("earlier", [1.0, 2.0])
    set_current(None)   # a new script's first ops go to a default graph
    (R.t(torch.full((40, 2), 3.0)) @ R.t(torch.eye(2))).persist_op("y")
    with pytest.raises(GraphStateError, match="graph 'default' .* is not activated"):
        R.fetch_persisting_op("y")


def test_track_progress_before_activation_is_refused(engine, module_workers):
    run_graph("started", [1.0, 2.0])
    R.Graph(name="never started")
    (R.t(torch.ones(40, 2)) @ R.t(torch.eye(2))).persist_op("y")
    with pytest.raises(GraphStateError, match="graph 'never started' .* is not activated.*R.activate"):
        R.track_progress(progress_bar=False, timeout=5)
    with pytest.raises(GraphStateError, match="not activated"):
        R.execute()
    R.Graph(name="empty")   # started by the user, nothing recorded yet: still not the last graph
    with pytest.raises(GraphStateError, match="graph 'empty' .* is not activated"):
        R.track_progress(progress_bar=False, timeout=5)


def test_a_second_process_tracks_and_fetches_the_graph_another_activated(engine, module_workers, server):
    """The requester exits after R.execute(); another process, which records nothing, tracks and fetches."""
    requester = textwrap.dedent(f"""
        import torch, ravop as R
        R.initialize({engine.token!r}, redis_url={server.url!r})
        R.Graph(name="detached")
        (R.t(torch.full((40, 2), 5.0)) @ R.t(torch.eye(2) * 2)).persist_op("y")
        R.activate()
        R.execute()
    """)
    reader = textwrap.dedent(f"""
        import torch, ravop as R
        R.initialize({engine.token!r}, redis_url={server.url!r})
        R.track_progress(progress_bar=False, timeout=120)
        assert torch.equal(R.fetch_persisting_op("y"), torch.full((40, 2), 10.0))
        R.execute()   # idempotent: the graph is started, its default graph empty
        R.track_progress(progress_bar=False, timeout=120)
        print("read", R.fetch_losses())
    """)
    for script in (requester, reader):
        done = subprocess.run([sys.executable, "-c", script], env=ENV, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    assert "read" in done.stdout
    set_current(None)   # and this process, as a later one that records nothing
    R.initialize(engine.token, redis_url=server.url)
    R.track_progress(progress_bar=False, timeout=120)
    assert torch.equal(R.fetch_persisting_op("y"), torch.full((40, 2), 10.0))


EMBEDDED_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import ravop as R
    R.initialize(token="stale-" + sys.argv[1], workers=0)
    R.Graph(name=sys.argv[2])
    (R.t([float(sys.argv[3])]) * 2).persist_op("y")   # small and constant: computed by R.activate(), no worker
    if sys.argv[2] == "first":
        R.activate()
        R.execute()
        R.track_progress(progress_bar=False, timeout=60)
        print("fetched", R.fetch_persisting_op("y").tolist())
    else:
        try:
            print("fetched", R.fetch_persisting_op("y").tolist())
        except R.GraphStateError as exc:
            print("refused:", exc)
""")


def test_another_scripts_graph_in_the_embedded_snapshot_does_not_answer(tmp_path):
    env = dict(ENV, RAVOP_DATA_DIR=str(tmp_path))   # the two scripts' embedded servers share their snapshot
    tag = os.urandom(4).hex()
    said = []
    for name, value in (("first", 1.0), ("second", 5.0)):
        done = subprocess.run([sys.executable, "-c", EMBEDDED_SCRIPT, tag, name, str(value)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        said.append(done.stdout.strip().splitlines()[-1])
    assert said[0] == "fetched [2.0]"
    assert said[1].startswith("refused: graph 'second'") and "not activated" in said[1], said[1]
