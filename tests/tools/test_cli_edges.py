"""The `ravop` command line at its edges: --help without loading torch, which embedded session it finds when
several ran, and where an unreachable URL came from."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ravop as R
from ravop.client import session as sessions

from test_cli import ravop, train_small_model

ROOT = str(Path(__file__).resolve().parents[2])


def test_help_and_argument_errors_do_not_load_torch():
    script = textwrap.dedent("""
        import sys
        from ravop.tools import cluster_cli
        for argv in (["--help"], ["status", "--help"], ["no-such-command"]):
            try:
                cluster_cli.main(argv)
            except SystemExit:
                pass
        print(sorted(name for name in ("torch", "numpy") if name in sys.modules))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


def test_status_finds_the_running_session_not_a_later_one_that_ended(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("RAVOP_REDIS_URL", raising=False)
    monkeypatch.delenv("RAVOP_TOKEN", raising=False)
    session = R.initialize(token="long-running", workers=0)
    try:
        short = subprocess.run([sys.executable, "-c", "import ravop as R; R.initialize(token='short', workers=0)"],
                               capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONPATH": ROOT})
        assert short.returncode == 0, short.stderr
        report = json.loads(ravop("status", "--json").stdout)
        assert report["token"] == "long-running"
    finally:
        session.close()
        sessions._session = None
    nothing = ravop("status", check=False)   # the session ended: nothing to find, and it says so
    assert nothing.returncode == 1 and "no running embedded session of this user" in nothing.stderr


def test_an_unreachable_url_is_named_with_where_it_came_from(monkeypatch):
    monkeypatch.delenv("RAVOP_REDIS_URL", raising=False)
    flag = ravop("status", "--redis", "redis://127.0.0.1:1/0", check=False)
    assert flag.returncode == 1
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in flag.stderr and "(the URL is from --redis)" in flag.stderr
    env = ravop("graphs", env={"RAVOP_REDIS_URL": "redis://127.0.0.1:1/0"}, check=False)
    assert env.returncode == 1 and "(the URL is from $RAVOP_REDIS_URL)" in env.stderr


def test_fetching_a_saved_model_prints_only_what_it_wrote(server, engine, workers, tmp_path):
    workers.start(1)
    train_small_model()
    path = tmp_path / "net.pt"
    done = ravop("fetch", "cli-train", "net", "-o", str(path), "--redis", server.url, "--token", engine.token)
    assert done.stderr == ""   # before: a TorchScript UserWarning about torch's own GraphModule
    assert done.stdout.startswith("wrote module 'net' of graph") and path.exists()
