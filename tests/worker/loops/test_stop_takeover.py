"""A stop request that a worker which took the loop over honours: the loop resumes from the checkpoint the dead
worker left and ends at the first epoch boundary from there, with the values of the run recorded that many epochs
long, bit for bit. Its own module: no other worker may take the loop while the test picks who runs it."""
import math

import ravop as R
from ravop.core import graph_states
from ravop.store import graphs as store_graphs
from ravop.tools import status

from helpers import wait_for
from test_stop_loop import BATCH, LONG, ROWS, assert_the_bits_of_the_fit_recorded, record

STEPS_PER_EPOCH = ROWS // BATCH
CHECKPOINTS = ("--checkpoint-steps", str(STEPS_PER_EPOCH), "--checkpoint-seconds", "1000")


def test_a_worker_taking_over_a_loop_stops_where_its_checkpoint_allows_with_the_same_bits(engine, workers):
    [first] = workers.start(1, extra=CHECKPOINTS)
    net, history = record(LONG, "taken-over")
    R.activate()
    R.execute()
    keys, client = engine.keys(), engine.client
    [sid] = wait_for(lambda: list(client.hkeys(keys.taken)), "the loop taken")
    wait_for(lambda: int(client.hget(keys.checkpoint(sid.decode()), "step") or 0) >= 3 * STEPS_PER_EPOCH,
             "three epochs checkpointed")
    workers.kill(first)
    saved = int(client.hget(keys.checkpoint(sid.decode()), "step"))
    assert status.request_stop(client, keys, "stop after the takeover", "test_stop_takeover")
    [second] = workers.start(1, extra=CHECKPOINTS)     # takes the dead worker's loop over, from its checkpoint
    R.track_progress(progress_bar=False)
    assert client.hget(keys.ran, sid) == second.encode()
    epochs = math.ceil(saved / STEPS_PER_EPOCH)   # the first boundary at or after the checkpoint
    meta = store_graphs.read_state(client, keys)
    assert meta["state"] == graph_states.DONE
    assert meta["stopped"] == f"stopped early at epoch {epochs} of {LONG} (stop after the takeover)"
    assert history.stopped_after == epochs and len(history.batch_losses) == epochs * STEPS_PER_EPOCH
    assert_the_bits_of_the_fit_recorded(epochs, net, history)
