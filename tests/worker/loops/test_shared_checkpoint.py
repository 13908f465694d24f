"""worker/loops/shared_checkpoint.py and worker/loops/sync_cadence.py on a real server: loops' checkpoint values stored
once by digest and referenced by each checkpoint that names them, deleted with the last reference (a writer that found
a value deleted meanwhile uploads it again); and the rounds between resident replicas' checkpoints, agreed by the
first to propose them."""
import threading

import pytest
import redis
import torch

from ravop.core.errors import PlanError
from ravop.store import GraphKeys
from ravop.store import tensors as stored
from worker.loops import shared_checkpoint as shared
from worker.loops.checkpoint_cadence import SPACING, CheckpointCadence
from worker.loops.sync_cadence import SyncCadence, agree, agreed, proposal, rounds_key, within_round_due


def checkpoint(client, keys, host, who):
    """Write `host` as checkpoint `who` would (the values the store lacks, its references), as loop_subgraph does."""
    names = shared.choose(host, {})
    shared.settle(client, keys, host, names, who)
    with client.pipeline(transaction=True) as pipe:
        present = shared.watch_present(pipe, client, keys, names)
        pipe.multi()
        chunks = client.pipeline(transaction=False)
        shared.write(pipe, chunks, keys, host, names, present, who, None)
        chunks.execute()
        pipe.execute()
    return names, present


def test_a_value_two_checkpoints_name_is_stored_once_and_deleted_with_the_last_reference(client):
    keys = GraphKeys("sharedtok", "g1")
    model, own_1, own_2 = torch.randn(64, 32), torch.randn(64, 32), torch.randn(64, 32)
    first, found = checkpoint(client, keys, [model, own_1], "1:10")
    assert found == set()
    second, found = checkpoint(client, keys, [model, own_2], "2:10")
    assert found == {first[0]} and second[0] == first[0]   # the global model: uploaded by the first only
    key = shared.value_key(keys, first[0])
    assert client.smembers(shared.refs_key(keys, first[0])) == {b"1:10", b"2:10"}
    assert torch.equal(shared.check(stored.read(client, key), first[0], "here"), model)
    shared.release(client, keys, first, "1:10")
    assert client.exists(key) and not client.exists(shared.value_key(keys, first[1]))   # its own value went
    shared.release(client, keys, second, "2:10")
    assert not client.exists(key, shared.refs_key(keys, first[0]), shared.value_key(keys, second[1]))


def test_a_writer_that_found_a_value_deleted_before_its_transaction_uploads_it_again(client):
    keys = GraphKeys("sharedtok", "g2")
    model = torch.randn(16, 16)
    names, _ = checkpoint(client, keys, [model], "1:5")
    key = shared.value_key(keys, names[0])
    with client.pipeline(transaction=True) as pipe:
        assert shared.watch_present(pipe, client, keys, names) == {names[0]}
        shared.release(client, keys, names, "1:5")   # the last reference goes, and the value with it
        assert not client.exists(key)
        pipe.multi()
        shared.write(pipe, client.pipeline(transaction=False), keys, [model], names, {names[0]}, "2:5", None)
        with pytest.raises(redis.WatchError):
            pipe.execute()
    assert not client.exists(shared.refs_key(keys, names[0]))   # nothing of the failed transaction landed
    _, found = checkpoint(client, keys, [model], "2:5")   # loop_subgraph's retry: looks again, uploads
    assert found == set() and torch.equal(stored.read(client, key), model)


class Looked(Exception):
    """Raised instead of settle's pause: the state after one look."""


def one_look(monkeypatch):
    def pause(seconds):
        raise Looked
    monkeypatch.setattr(shared.time, "sleep", pause)


def test_a_loop_claims_values_in_digest_order_and_holds_none_past_one_it_waits_for(client, monkeypatch):
    keys = GraphKeys("sharedtok", "g4")
    values = [torch.full((4,), float(v)) for v in range(6)]
    names = shared.choose(values, {})
    order = sorted(names.values())
    held = order[2]   # another loop claimed the third in digest order: it uploads it
    client.set(shared.claim_key(keys, held), "1:7")
    one_look(monkeypatch)
    with pytest.raises(Looked):
        shared.settle(client, keys, values, names, "2:7")
    claims = [client.get(shared.claim_key(keys, name)) for name in order]
    # the two before it are this loop's, none after it (else two loops could each wait for the other's)
    assert claims == [b"2:7", b"2:7", b"1:7", None, None, None]


def test_a_loop_waits_for_a_value_another_claimed_and_uploads_only_its_own(client):
    keys = GraphKeys("sharedtok", "g5")
    model, own = torch.randn(32, 8), torch.randn(32, 8)
    names = shared.choose([model, own], {})
    client.set(shared.claim_key(keys, names[0]), "1:7")   # loop 1 claimed the global model at this synchronisation
    settled = threading.Thread(target=shared.settle, args=(client, keys, [model, own], names, "2:7"))
    settled.start()
    settled.join(0.5)
    assert settled.is_alive()   # waiting for loop 1's model
    with client.pipeline(transaction=True) as pipe:   # loop 1's checkpoint lands with the model
        shared.write(pipe, client.pipeline(transaction=False), keys, [model], {0: names[0]}, set(), "1:7", None)
        pipe.execute()
    settled.join()
    assert client.get(shared.claim_key(keys, names[1])) == b"2:7"   # its own value: its transaction uploads it
    assert not client.exists(shared.claim_key(keys, names[0]), shared.value_key(keys, names[1]))


def test_a_claim_whose_holder_died_lapses_and_a_waiting_loop_claims_the_value(client):
    keys = GraphKeys("sharedtok", "g6")
    model = torch.randn(8, 8)
    names = shared.choose([model], {})
    client.set(shared.claim_key(keys, names[0]), "1:3", px=200)   # its holder was killed before uploading
    shared.settle(client, keys, [model], names, "2:3")
    assert client.get(shared.claim_key(keys, names[0])) == b"2:3"


def test_values_are_named_by_their_bits_dtype_and_shape():
    a = torch.randn(3, 4)
    assert shared.digest(a) == shared.digest(a.clone())
    assert len({shared.digest(v) for v in (a, a.reshape(4, 3), a.double(), a + 0.5, torch.tensor([0.0]),
                                          torch.tensor([-0.0]))}) == 6
    assert shared.choose([a, a.clone(), 7], {1: 0}) == {0: shared.digest(a)}   # aliases and non-tensors: not shared
    with pytest.raises(PlanError, match="does not match its digest"):
        shared.check(a + 1, shared.digest(a), "the checkpoint of loop subgraph 3 at step 8")


def test_the_shared_field_round_trips_and_bad_ones_are_refused():
    names = {0: "0" * 32, 3: "ab" * 16}
    assert shared.decode(shared.encode(names).encode(), 4) == names
    assert shared.encode({}) == "" and shared.decode(None, 2) == {} and shared.decode(b"", 2) == {}
    for bad in (b"4=" + b"0" * 32, b"0=abc", b"0=" + b"g" * 32, b"0", b"x=" + b"0" * 32,
                b"1=" + b"0" * 32 + b",1=" + b"1" * 32):
        with pytest.raises(ValueError):
            shared.decode(bad, 4)


def test_the_first_proposed_rounds_stand_for_every_loop_of_the_graph(client):
    keys = GraphKeys("sharedtok", "g3")
    assert agreed(client, keys) is None
    assert agree(client, keys, 40) == 40
    assert agree(client, keys, 37) == 40 and agreed(client, keys) == 40   # what a resumed loop reads
    client.set(rounds_key(keys), b"zero")
    with pytest.raises(PlanError, match="not a positive number"):
        agree(client, keys, 5)


def test_a_loop_checkpoints_on_the_multiples_of_the_agreed_rounds():
    cadence = SyncCadence(60.0, now=0.0)
    assert cadence.at_sync(1, 10.0, 1000, 100) == (False, None)   # its clock is not due
    due, rounds = cadence.at_sync(30, 61.0, 1000, 30_000)   # due: proposes the 30 rounds it ran, and a lead
    assert not due and rounds == proposal(30, 1000, 30_000, 61.0) == 30 + 4
    assert cadence.at_sync(31, 62.0, 1000, 31_000) == (False, None)   # proposed once
    cadence.agreed(32)   # another loop's proposal stood
    assert [k for k in range(32, 100) if cadence.at_sync(k, 70.0, 1000, 100)[0]] == [32, 64, 96]
    late = SyncCadence(60.0, now=0.0)   # resumed at round 40: falls in with the others from the next multiple
    late.agreed(32)
    hits = [k for k in range(41, 130) if late.at_sync(k, 1.0, 1000, 100)[0] and late.taken(k, 1.0) is None]
    assert hits == [64, 96, 128]
    assert SyncCadence(0, now=0.0).at_sync(5, 0.0, 1, 1) == (True, None)   # 0 s: every synchronisation


def test_a_checkpoint_far_bigger_than_what_a_round_sends_is_taken_less_often():
    # 30 rounds in the cadence, but the state is 24 times what a round sends: at most a quarter of those bytes
    assert proposal(30, state_bytes=24_000, sent_bytes=30 * 1000) == 96 + 12
    assert proposal(2, 0, 0) == 2 + 2
    assert proposal(1, 0, 0) == 1   # every synchronisation is a common one: no lead


def test_long_rounds_checkpoint_within_the_max_gap_whatever_the_bytes_floor():
    # the WAN lab's DiLoCo: one round of 29 s sends a small share of the state: the bytes' floor alone says 126 rounds
    assert proposal(1, state_bytes=600_000, sent_bytes=20_000) > 100
    # 30 s: one round, and no lead (it spaced these checkpoints 3 rounds, 126 s, apart in the WAN lab)
    assert proposal(1, state_bytes=600_000, sent_bytes=20_000, elapsed=29.0) == 1
    assert proposal(1, state_bytes=600_000, sent_bytes=20_000, elapsed=42.0) == 1
    # short rounds: the floor stands while its rounds fit in the gap (30 rounds in 3 s: up to 300 rounds)
    assert proposal(30, 24_000, 30 * 1000, elapsed=3.0) == 96 + 12
    assert proposal(30, 2_400_000, 30 * 1000, elapsed=3.0) == 300 + 38


def test_a_round_longer_than_the_checkpoint_interval_is_checkpointed_within():
    timing = CheckpointCadence(seconds=10.0, adaptive=False)
    # a round of 42 s began at 0, the last checkpoint at its start: one within it every 10 s, none in flight
    assert not within_round_due(timing, 9.9, round_began=0.0, last=0.0)
    assert within_round_due(timing, 10.0, round_began=0.0, last=0.0)
    timing.taken(0.001)
    assert not within_round_due(timing, 30.0, round_began=0.0, last=10.0)   # the last one is still being written
    timing.written(0.05)
    assert within_round_due(timing, 20.0, round_began=0.0, last=10.0)
    # short rounds (each synchronisation resets the round's clock) keep to the agreed synchronisations
    assert not within_round_due(timing, 100.0, round_began=95.0, last=0.0)
    # an adaptive cadence: 50x the last checkpoint's cost, at most its seconds
    adaptive = CheckpointCadence(seconds=10.0, adaptive=True, least=0.5)
    adaptive.taken(0.0)
    adaptive.written(0.1)
    assert adaptive.every == SPACING * 0.1
    assert not within_round_due(adaptive, 4.9, 0.0, 0.0) and within_round_due(adaptive, 5.0, 0.0, 0.0)
