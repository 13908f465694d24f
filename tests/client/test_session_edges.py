"""What a new user runs into at the edges of a session: Ctrl-C while tracking (one line, no traceback),
SIGTERM (the embedded default's temp dir goes), the progress bar's first rate and a fully folded graph,
float() of a lazy op, and fetching before R.execute()."""
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ravop as R
from ravop.core.errors import NotComputedError

from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]

# A requester that starts a graph nobody runs (no worker serves this server or the embedded one), says
# "ready" and the embedded server's folder, then tracks it.
WAITING_REQUESTER = textwrap.dedent("""
    import sys
    import torch
    import ravop as R
    url = sys.argv[1] or None
    session = R.initialize(token="edge-" + sys.argv[2], redis_url=url, workers=0)
    R.Graph(name="waiting")
    (R.t(torch.ones(100, 100)) @ R.t(torch.ones(100, 100))).persist_op("y")  # too big to fold: a worker's job
    R.activate()
    R.execute()
    print("ready", session.embedded.server.dir if session.embedded else "", flush=True)
    R.track_progress(progress_bar=False)
""")


def start_requester(url, tag):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-c", WAITING_REQUESTER, url, tag], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("ready"), proc.communicate()[1]
    # Inside track_progress's wait once it says what it waits for (importing its progress bar can take
    # seconds under load: a signal sent earlier would land outside it). Returns what it said meanwhile.
    said = []
    while not said or "waiting for a CPU worker" not in said[-1]:
        said.append(proc.stderr.readline())
        assert said[-1], "".join(said) + proc.communicate()[1]   # it exited
    return proc, line.split(" ", 1)[1].strip(), "".join(said)


def test_ctrl_c_on_a_cluster_prints_one_line_and_how_to_resume(server):
    proc, _, said = start_requester(server.url, "cluster")
    proc.send_signal(signal.SIGINT)
    err = said + proc.communicate(timeout=300)[1]
    lines = [line for line in err.splitlines() if line.strip() and "waiting for a CPU worker" not in line]
    assert proc.returncode in (-signal.SIGINT, 130), err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert re.match(r"interrupted R\.track_progress\(\) of graph 'waiting' \(0 of \d+ ops run\): it keeps running "
                    r"on the workers of unix://.*R\.initialize\(token='edge-cluster'.* resumes", lines[0]), lines[0]


def test_ctrl_c_on_the_embedded_default_says_it_stopped_and_cleans_up():
    proc, folder, said = start_requester("", "embedded")
    assert os.path.isdir(folder)
    proc.send_signal(signal.SIGINT)
    err = said + proc.communicate(timeout=300)[1]
    lines = [line for line in err.splitlines() if line.strip() and "waiting for a CPU worker" not in line]
    assert "Traceback" not in err and len(lines) == 1, err
    assert "it stops with this process" in lines[0]
    assert not os.path.exists(folder)


def test_sigterm_removes_the_embedded_default_folder():
    proc, folder, _ = start_requester("", "sigterm")
    server_pids = subprocess.run(["pgrep", "-f", folder], capture_output=True, text=True).stdout.split()
    assert server_pids  # the server runs with its socket in that folder
    proc.terminate()
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGTERM  # still dies of the signal
    assert not os.path.exists(folder)
    wait_for(lambda: not subprocess.run(["pgrep", "-f", folder], capture_output=True, text=True).stdout.split(),
             "the embedded server to exit")


def test_float_of_an_op_says_it_is_lazy_and_how_to_fetch():
    R.Graph(name="lazy")
    x = R.t([1.0]).sum()
    with pytest.raises(TypeError, match=r"float\(\) of .*ops are lazy.*R\.fetch_persisting_op\('name'\)"):
        float(x)
    with pytest.raises(TypeError, match="int\\(\\) of .*ops are lazy"):
        int(x)


def test_fetch_before_execute_is_refused_whether_or_not_the_value_was_folded(engine):
    R.Graph(name="early")
    folded = R.t([1.0, 2.0]) * 2               # small and constant: computed by R.activate()
    big = R.t(torch.ones(300, 300)) @ R.t(torch.ones(300, 300))  # left to a worker
    folded.persist_op("folded")
    big.persist_op("big")
    R.activate()
    for name in ("folded", "big"):
        with pytest.raises(NotComputedError, match="activated but not started; call R.execute"):
            R.fetch_persisting_op(name)


def test_a_fully_folded_graph_shows_no_empty_bar(engine, capsys):
    R.Graph(name="folded")
    (R.t([1.0, 2.0]) * 2 + 1).persist_op("y")
    summary = R.activate()
    assert summary["subgraphs"] == 0
    R.execute()
    R.track_progress()
    err = capsys.readouterr().err
    assert "0op" not in err and "computed entirely by R.activate() (constant folding)" in err
    assert torch.equal(R.fetch_persisting_op("y"), torch.tensor([3.0, 5.0]))


def test_the_first_progress_rate_counts_only_work_seen_running(engine, workers, capsys):
    workers.start(1)
    R.Graph(name="rate")
    x = R.t(torch.rand(100, 100))
    for _ in range(30):
        x = (x @ x).tanh()  # too big to fold: run by the worker
    x.persist_op("y")
    assert R.activate()["compiled_ops"] > 0
    R.execute()
    R.fetch_persisting_op("y", wait=True, timeout=120)  # all done before the bar appears
    capsys.readouterr()
    R.track_progress()
    err = capsys.readouterr().err
    rates = [float(v) * {"": 1, "k": 1e3, "M": 1e6}[unit] for v, unit in re.findall(r"([\d.]+)([kM]?)op/s", err)]
    assert all(rate < 1e4 for rate in rates), err
