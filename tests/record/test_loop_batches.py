"""A loop's steps that read rows must cover its data once a round in the batches `Batches` cuts (the rows a step
slices are part of its shapes): recording matches the schedule against `batch_steps` run by run, naming the first
step and batch that disagree."""
import numpy as np
import pytest

import ravop as R
from ravop.record.loop import Batches, Loop


def record(n_rows, batch_size, rows_per_template, schedule):
    R.Graph(name="batches")
    data = R.t(np.zeros((n_rows, 2), dtype=np.float32))
    loop = Loop([R.t(np.zeros(2, dtype=np.float32))], Batches(n_rows, batch_size))
    for rows in rows_per_template:
        with loop.step() as step:
            step.carry([step.carried[0] + R.sum(step.rows(data, rows), axis=0)])
    return loop.run(schedule)


@pytest.mark.parametrize("schedule", [[(0, 5), (1, 1)], [(0, 2), (0, 3), (1, 1)]])
def test_full_batches_then_the_short_one_cover_a_round(schedule):
    [final] = record(53, 10, [10, 3], schedule)
    [spec] = [record.spec for record in final.graph.loops.values()]
    assert spec.n_steps == 6


@pytest.mark.parametrize("schedule, words", [
    ([(0, 4), (1, 1)], "step 1 reads 3 rows where batch 5 has 10"),
    ([(0, 6)], "step 0 reads 10 rows where batch 6 has 3"),
    ([(1, 1), (0, 5)], "step 1 reads 3 rows where batch 1 has 10"),
    ([(0, 5), (1, 2)], "step 1 reads 3 rows where batch 6 has 0"),
    ([(0, 5), (1, 1), (0, 1)], "step 0 reads 10 rows where batch 6 has 0"),
    ([(0, 3)], "one round of the loop reads 30 rows of 53"),
])
def test_a_schedule_that_does_not_cut_the_data_into_its_batches_is_refused_by_name(schedule, words):
    with pytest.raises(ValueError, match=words):
        record(53, 10, [10, 3], schedule)


def test_a_round_of_a_million_batches_records_as_one_run_of_the_schedule():
    [final] = record(10**6, 1, [1], [(0, 10**6)])
    [spec] = [record.spec for record in final.graph.loops.values()]
    assert spec.n_steps == 10**6 and spec.schedule == [(0, 10**6)]
