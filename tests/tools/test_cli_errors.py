"""Every failure of the command lines is one line on stderr (never a traceback), and no credential of a URL is
printed or logged anywhere: not in the user part, not in a query parameter (`?password=`), not by R.initialize,
`ravop status`, `ravop-worker`'s lines or any error."""
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

import ravop as R
from ravop.core.errors import ConnectionFailed
from ravop.store.connect import redact
from ravop.tools import admin

from conftest import Workers
from test_cli import ROOT, ravop

SECRET = "hunter2-" + uuid.uuid4().hex


def test_redact_hides_passwords_in_the_user_part_and_in_query_parameters():
    assert redact(f"redis://bob:{SECRET}@h:6379/0") == "redis://bob:***@h:6379/0"
    assert redact(f"redis://h:6379/0?password={SECRET}&ssl_ca_certs=/a/ca.pem") == \
        "redis://h:6379/0?password=***&ssl_ca_certs=/a/ca.pem"
    assert redact(f"unix:///tmp/r.sock?db=0&password={SECRET}") == "unix:///tmp/r.sock?db=0&password=***"
    assert redact(f"rediss://u:{SECRET}@h/0?ssl_password={SECRET}") == "rediss://u:***@h/0?ssl_password=***"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"
    assert SECRET not in redact(f"redis://[::1/0?password={SECRET}")


def one_line_failure(result):
    """The stderr of a failed command, asserted to be one line without a traceback or a secret."""
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert SECRET not in result.stderr + result.stdout
    return lines[0]


@pytest.fixture
def two_tokens(server):
    """Two `ravop admin` token users (the second with a graph), removed afterwards."""
    suffix = uuid.uuid4().hex[:6]
    names = [f"ann-{suffix}", f"ben-{suffix}"]
    client = redis.Redis.from_url(server.url)
    urls = [admin.create(client, server.url, "token", name)[0] for name in names]
    yield names, urls
    for name in names:
        client.execute_command("ACL", "DELUSER", name)
    client.close()


def test_every_command_with_another_users_token_fails_in_one_line(server, two_tokens, tmp_path):
    (ann, ben), (ann_url, _) = two_tokens
    for command in (["status"], ["graphs"], ["cancel", "g1"], ["logs", "g1"],
                    ["fetch", "g1", "x", "-o", str(tmp_path / "x.npy")]):
        line = one_line_failure(ravop(*command, "--redis", ann_url, "--token", ben, check=False))
        assert line.startswith(f"ravop {command[0]}: "), line
        assert "refused" in line or "may not" in line or "no graph" in line, line


def test_admin_commands_fail_in_one_line(server, two_tokens):
    (ann, _), (ann_url, _) = two_tokens
    for command in (["admin", "token", "create", "eve"], ["admin", "token", "list"],
                    ["admin", "worker", "revoke", "nobody"]):
        one_line_failure(ravop(*command, "--redis", ann_url, check=False))
    line = one_line_failure(ravop("admin", "worker", "revoke", "nobody", "--redis", server.url, check=False))
    assert "no worker user 'nobody'" in line


def test_unreachable_and_refusing_servers_fail_in_one_line_without_the_secret(server, two_tokens):
    (ann, _), (ann_url, _) = two_tokens
    unreachable = f"redis://127.0.0.1:1/0?password={SECRET}"
    assert "password=***" in one_line_failure(ravop("status", "--redis", unreachable, check=False))
    wrong = ann_url.replace(ann_url.split(":")[2].split("@")[0], SECRET)   # ann with a wrong password
    assert "refused" in one_line_failure(ravop("graphs", "--redis", wrong, check=False))
    with pytest.raises(ConnectionFailed) as refused:
        R.initialize(redis_url=unreachable)
    assert SECRET not in str(refused.value) and "password=***" in str(refused.value)
    worker = subprocess.run([sys.executable, "-m", "worker", "--redis", unreachable], capture_output=True, text=True,
                            env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"}, timeout=300)
    assert "password=***" in one_line_failure(worker)


def test_a_url_with_a_query_password_is_never_printed(server, two_tokens, tmp_path):
    """The credentials as query parameters (redis-py reads ?username=&password=): status, R.initialize's
    messages and a worker's log show them redacted."""
    (ann, _), (ann_url, _) = two_tokens
    secret = ann_url.split(":")[2].split("@")[0]
    path = ann_url.split("@", 1)[1]
    query_url = f"unix://{path}?username={ann}&password={secret}"
    status = ravop("status", "--redis", query_url, "--token", ann)
    assert secret not in status.stdout + status.stderr and "password=***" in status.stdout, status.stdout
    worker_name = f"wq-{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(server.url)
    worker_url, _ = admin.create(client, server.url, "worker", worker_name)
    worker_secret = worker_url.split(":")[2].split("@")[0]
    pool = Workers(f"unix://{path}?username={worker_name}&password={worker_secret}", tmp_path)
    try:
        [name] = pool.start(1, extra=["-v"])
        admin.revoke(client, "worker", worker_name)   # its exit line names the refusal, not the password
        assert pool.procs[name].wait() == 1
        log = Path(pool.log_path(name)).read_text()
        assert worker_secret not in log and "refused its credentials" in log, log
    finally:
        pool.stop_all()
        client.close()
