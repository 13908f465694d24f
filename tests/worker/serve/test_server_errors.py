"""Workers never exit on a server-side error: a work stream replaced by a string (WRONGTYPE), its consumer group
destroyed (NOGROUP), a long script making the server answer BUSY to everyone. They log, back off and keep
serving, and the damaged structure is made again. A graph whose keys were destroyed or damaged fails its tracker
with a clear reason instead of hanging."""
import random

import pytest
import redis

import ravop as R
from ravop.core.errors import GraphStateError
from ravop.store import DEAD_LETTER, GROUP, queue, repair
from ravop.store.server_replies import kind_of
from worker.serve.server_errors import CAP, FIRST, ServerErrors

from helpers import assert_a_valid_graph_runs, wait_for
from test_cli import ravop
from test_revocation import track_in_thread, waiting_graph

BUSY_SCRIPT = """local start = redis.call('TIME')
while true do
  local now = redis.call('TIME')
  if (now[1] - start[1]) * 1000000 + (now[2] - start[2]) > tonumber(ARGV[1]) then return 1 end
end"""


def test_errors_are_classified_by_what_a_client_should_do():
    assert kind_of(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")) \
        == "damaged"
    assert kind_of(redis.ResponseError("NOGROUP No such key 'x' or consumer group 'workers'")) == "damaged"
    assert kind_of(redis.exceptions.NoScriptError("NOSCRIPT No matching script")) == "damaged"
    assert kind_of(redis.ResponseError("BUSY Redis is busy running a script.")) == "transient"
    assert kind_of(redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down")) == "transient"
    assert kind_of(redis.TimeoutError("Timeout reading from socket")) == "transient"
    assert kind_of(redis.exceptions.NoPermissionError("NOPERM no permissions")) == "refused"


def test_the_backoff_doubles_to_a_cap_with_jitter_and_starts_over_after_a_success(client):
    errors = ServerErrors(client, "unit", random.Random(0))
    busy = redis.ResponseError("BUSY Redis is busy running a script.")
    waits = [errors.met(busy) for _ in range(12)]
    nominal = [min(FIRST * 2**i, CAP) for i in range(12)]
    assert all(d / 2 <= w <= d for w, d in zip(waits, nominal)), waits
    assert len(set(waits)) == len(waits)   # jittered: workers do not come back in step
    errors.ok()
    assert FIRST / 2 <= errors.met(busy) <= FIRST


def test_repair_makes_the_streams_again_and_says_what_it_did(client):
    assert repair.work_streams(client) == []
    client.delete(queue("cuda"))
    client.set(queue("cuda"), "junk")
    client.delete(DEAD_LETTER)
    client.hset(DEAD_LETTER, "a", "b")
    client.xgroup_destroy(queue("cpu"), GROUP)
    repaired = repair.work_streams(client)
    assert any("was a string" in line for line in repaired), repaired
    assert any("was a hash" in line for line in repaired), repaired
    assert any("lost its consumer group" in line for line in repaired), repaired
    assert client.type(queue("cuda")) == b"stream" and client.type(DEAD_LETTER) in (b"none", b"stream")
    assert repair.work_streams(client) == []


def test_workers_survive_a_stream_replaced_by_a_string_and_a_destroyed_group(server, engine, workers, client):
    names = workers.start(2)
    client.delete(queue("cpu"))
    client.set(queue("cpu"), "not a stream")
    wait_for(lambda: client.type(queue("cpu")) == b"stream", "a worker to make the stream again")
    assert_a_valid_graph_runs()
    client.xgroup_destroy(queue("cpu"), GROUP)
    wait_for(lambda: client.xinfo_groups(queue("cpu")), "a worker to make the consumer group again")
    assert_a_valid_graph_runs()
    assert all(workers.alive(name) for name in names), [workers.log(n) for n in names]
    logs = "".join(workers.log(name) for name in names)
    assert "was a string, not a stream: made an empty stream again" in logs, logs
    assert "had lost its consumer group 'workers': made again" in logs, logs


def test_workers_survive_a_server_busy_with_a_long_script(server, engine, workers, client):
    names = workers.start(2)
    admin = redis.Redis.from_url(server.url)
    old = admin.config_get("busy-reply-threshold")["busy-reply-threshold"]
    # Work flowing when the script starts (malformed messages, each dead-lettered in a few round trips): a
    # worker blocked reading an empty stream is not answered until the script ends, and would see nothing.
    pipe = admin.pipeline(transaction=False)
    for i in range(3000):
        pipe.xadd(queue("cpu"), {"junk": str(i)})
    pipe.execute()
    admin.config_set("busy-reply-threshold", 100)   # answer BUSY after 0.1 s of a script, not 5 s
    try:
        admin.eval(BUSY_SCRIPT, 0, 3_000_000)
    finally:
        admin.config_set("busy-reply-threshold", old)
        admin.close()
    wait_for(lambda: any("BUSY" in workers.log(n) for n in names), "a worker to log BUSY")
    assert_a_valid_graph_runs()
    assert all(workers.alive(name) for name in names), [workers.log(n) for n in names]
    busy = [n for n in names if "BUSY" in workers.log(n)]   # each ends its episode after its backoff wait
    wait_for(lambda: all("answers normally again" in workers.log(n) for n in busy), "the workers to serve again")


def test_a_tracker_of_a_graph_whose_keys_were_destroyed_or_damaged_fails_with_the_reason(engine, client):
    waiting_graph("deleted")
    keys = engine.keys()
    tracker, ended = track_in_thread()
    client.delete(keys.meta)
    tracker.join()
    assert isinstance(ended["error"], GraphStateError) and "no longer in Redis" in str(ended["error"])

    waiting_graph("damaged")
    keys = engine.keys()
    client.delete(keys.meta)
    client.set(keys.meta, "junk")
    with pytest.raises(GraphStateError, match="WRONGTYPE.*damaged"):
        R.track_progress(progress_bar=False)


def test_an_admin_command_repairs_a_damaged_stream(server, client):
    client.delete(queue("cpu"))
    client.set(queue("cpu"), "not a stream")
    result = ravop("admin", "token", "list", "--redis", server.url)
    assert f"ravop admin: repaired {queue('cpu')} was a string, not a stream" in result.stderr, result.stderr
    assert client.type(queue("cpu")) == b"stream" and client.xinfo_groups(queue("cpu"))
