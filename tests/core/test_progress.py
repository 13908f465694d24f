"""Progress bars appear on stderr only for work that takes more than a second."""
import time

import numpy as np
import torch

import ravop as R
from ravop.core import progress

from helpers import wait_for


def test_busy_shows_a_clock_only_after_the_delay(capsys):
    with progress.busy("quick work"):
        time.sleep(0.1)
    time.sleep(2 * progress.REFRESH)
    assert "quick work" not in capsys.readouterr().err
    said = []
    with progress.busy("slow work"):   # until its clock shows a second: under load that takes longer
        wait_for(lambda: said.append(capsys.readouterr().err) or "slow work: 00:01" in "".join(said),
                 "the clock of a block busy for a second")


def test_bar_appears_only_when_updates_come_after_the_delay(capsys):
    with progress.bar(3, "fast steps") as steps:
        steps.update(3)
    assert "fast steps" not in capsys.readouterr().err
    with progress.bar(3, "slow steps") as steps:
        steps.update(1)
        time.sleep(progress.DELAY + 0.1)
        steps.update(2)
    assert "slow steps" in capsys.readouterr().err


def test_a_quick_graph_prints_no_progress(engine, module_workers, capsys):
    R.Graph(name="quick")
    (R.t(torch.ones(80, 80)) @ R.t(torch.ones(80, 80))).persist_op("y")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    np.testing.assert_array_equal(R.fetch_persisting_op("y").numpy(), np.full((80, 80), 80.0))
    assert capsys.readouterr().err == ""
