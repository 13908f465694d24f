"""When a loop's periodic checkpoints are due (worker/loops/checkpoint_cadence.py), where they are written (in the
loop's thread for a fast store) and the one host buffer they are written from otherwise
(worker/loops/checkpoint_buffer.py): pure code, no server."""
import torch

from worker.loops.checkpoint_buffer import CheckpointBuffer
from worker.loops.checkpoint_cadence import (IN_LOOP_BYTES_PER_S, IN_LOOP_SECONDS, SPACING, STALL_SPACING,
                                             CheckpointCadence)


def test_none_is_taken_while_the_last_is_being_written_and_the_one_due_meanwhile_follows_it():
    cadence = CheckpointCadence(seconds=10.0, adaptive=True, least=0.5)
    assert cadence.due(False, since=0.0, now=0.5)
    cadence.taken(copy_seconds=0.001)
    # its write takes 30 s: neither the interval nor the steps asked for take another meanwhile
    assert not cadence.due(False, since=0.5, now=20.0) and not cadence.due(True, since=0.5, now=20.0)
    cadence.written(write_seconds=30.0)
    assert cadence.every == 10.0   # 50x its cost, at most `seconds`
    cadence.taken(copy_seconds=0.002)
    assert cadence.copied == 0.003   # what the copies cost the loop, all told
    cadence.written(write_seconds=30.0)
    assert cadence.due(False, since=0.5, now=30.5)   # the one that came due meanwhile: at once, the latest state


def test_an_adaptive_cadence_follows_the_cost_between_its_bounds():
    cadence = CheckpointCadence(seconds=10.0, adaptive=True, least=0.5)
    cadence.taken(0.02)
    cadence.written(0.04)
    assert abs(cadence.every - SPACING * 0.06) < 1e-9
    cadence.taken(0.0)
    cadence.written(0.001)
    assert cadence.every == 0.5
    assert not cadence.due(False, since=1.0, now=1.4) and cadence.due(False, since=1.0, now=1.5)


def test_the_first_checkpoint_of_an_adaptive_cadence_is_spaced_by_what_it_should_cost():
    cadence = CheckpointCadence(seconds=10.0, adaptive=True, least=0.5)
    cadence.expect(nbytes=40_000_000, bytes_per_s=4e8)   # 0.1 s to write: the first 5 s into the loop
    assert abs(cadence.every - SPACING * 0.1) < 1e-9
    assert not cadence.due(False, since=0.0, now=4.9) and cadence.due(False, since=0.0, now=5.0)
    cadence.expect(nbytes=185_000_000, bytes_per_s=4e8)   # a GPT's Adam state: at most `seconds`
    assert cadence.every == 10.0
    cadence.expect(nbytes=1_000, bytes_per_s=4e8)         # a small state: `least`, as before
    assert cadence.every == 0.5
    cadence.expect(nbytes=10**9, bytes_per_s=0.0)         # no rate measured: `least`
    assert cadence.every == 0.5
    fixed = CheckpointCadence(seconds=3.0, adaptive=False)
    fixed.expect(nbytes=10**9, bytes_per_s=1.0)            # --checkpoint-seconds: kept
    assert fixed.every == 3.0


def test_the_copies_stall_the_loop_at_most_one_in_stall_spacing_whatever_seconds_ask():
    for adaptive in (True, False):
        cadence = CheckpointCadence(seconds=2.0, adaptive=adaptive, least=0.5)
        cadence.taken(copy_seconds=0.4)   # a 100M-parameter state's copy
        cadence.written(write_seconds=1.0)
        assert cadence.every == STALL_SPACING * 0.4 > 2.0
        assert not cadence.due(False, since=0.0, now=9.9) and cadence.due(False, since=0.0, now=10.0)


def test_a_fixed_cadence_keeps_its_seconds_and_steps_asked_for_are_taken_at_once():
    cadence = CheckpointCadence(seconds=3.0, adaptive=False)
    assert cadence.every == 3.0 and not cadence.due(False, since=0.0, now=2.9) and cadence.due(True, 0.0, 0.1)
    cadence.taken(0.0)
    cadence.written(100.0)
    assert cadence.every == 3.0
    # a loop that exchanges values asks at its synchronisations, with no interval of its own
    assert not cadence.due(False, since=None, now=1e9) and cadence.due(True, since=None, now=1e9)


def test_the_buffer_is_refilled_in_place_and_keeps_each_checkpoint_apart_from_the_loop():
    buffer, state = CheckpointBuffer(), [torch.arange(6.0).reshape(2, 3), torch.tensor([1, 2], dtype=torch.int64)]
    first = buffer.fill(state)
    assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip(first, state))
    pointers = [t.data_ptr() for t in first]
    state[0] += 1   # the loop updates its state in place: the copy keeps the step it was taken at
    assert torch.equal(first[0], torch.arange(6.0).reshape(2, 3))
    second = buffer.fill(state)
    assert [t.data_ptr() for t in second] == pointers and torch.equal(second[0], state[0])
    third = buffer.fill([torch.zeros(4), state[1]])   # another shape: made anew
    assert third[0].shape == (4,) and third[0].data_ptr() != pointers[0]


def test_writes_in_the_loops_thread_are_its_stall_and_a_slow_one_sends_the_next_beside_it():
    cadence = CheckpointCadence(seconds=10.0, adaptive=False, in_loop=True)
    cadence.taken(copy_seconds=0.0)   # no copy: the loop's own tensors are written
    cadence.written(write_seconds=0.5, nbytes=int(IN_LOOP_BYTES_PER_S))   # 2x the rate: stays in the loop
    assert cadence.in_loop and cadence.copied == 0.5
    assert cadence.every == STALL_SPACING * 0.5 > 10.0   # the write stalled the loop: spaced as a copy would be
    cadence.taken(copy_seconds=0.0)
    cadence.written(write_seconds=2.0, nbytes=int(IN_LOOP_BYTES_PER_S))   # slower than the bound
    assert not cadence.in_loop and cadence.copied == 2.5
    cadence.taken(copy_seconds=0.01)
    cadence.written(write_seconds=30.0, nbytes=int(IN_LOOP_BYTES_PER_S))   # beside the loop: only its copy stalls
    assert not cadence.in_loop and cadence.copied == 2.51 and cadence.every == 10.0
    small = CheckpointCadence(seconds=10.0, adaptive=True, in_loop=True)
    small.taken(0.0)
    small.written(write_seconds=IN_LOOP_SECONDS, nbytes=30_000)   # a round trip: slow per byte, short all told
    assert small.in_loop


def test_a_fenced_checkpoint_reads_the_live_tensors_while_its_write_fits_in_a_step_and_its_wait_is_the_stall():
    cadence = CheckpointCadence(seconds=10.0, adaptive=True, least=0.5)
    cadence.expect(nbytes=185_000_000, bytes_per_s=4e8)   # 0.46 s to write
    assert not cadence.from_live(185_000_000, step_seconds=0.2)      # a copy into the buffer: no wait for the write
    assert cadence.from_live(185_000_000, step_seconds=0.25)         # a wait of up to a step, no copy
    cadence.taken(0.0, fenced=True)
    cadence.written(write_seconds=0.15, nbytes=185_000_000)          # its write measures the store's rate
    assert abs(cadence.rate - 185_000_000 / 0.15) < 1 and cadence.copied == 0.0
    assert cadence.from_live(185_000_000, step_seconds=0.1)
    assert abs(cadence.every - SPACING * 0.15) < 1e-9               # the write is not the loop's stall
    cadence.taken(0.0, fenced=True)
    cadence.waited(0.5, step_seconds=0.6)                              # the next step's updates waited 0.5 s
    cadence.written(write_seconds=0.5, nbytes=185_000_000)
    assert cadence.copied == 0.5 and cadence.every == STALL_SPACING * 0.5 > 10.0   # spaced by its stall
    assert cadence.from_live(1_000, step_seconds=0.6)                # within a step: still no copy
    cadence.taken(0.0, fenced=True)
    cadence.waited(0.5, step_seconds=0.1)                              # a wait over a step: copies from now on
    assert not cadence.from_live(1_000, step_seconds=10.0)
