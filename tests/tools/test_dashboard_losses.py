"""The dashboard's loss curve for long fits: thinned on the server to the extremes of each bucket (first and
last step kept), and drawn with its axis labels inside the chart, whatever their width."""
import json
import time
import urllib.request
import uuid

import numpy as np
import pytest
import torch

from ravop.client.training_losses import Losses
from ravop.core import graph_states
from ravop.core.loss_names import training_loss_name, validation_loss_name
from ravop.store import GraphKeys, TokenKeys
from ravop.tools.dashboard import Dashboard
from ravop.tools.dashboard.loss_points import MAX_POINTS, curve, extremes_per_bucket
from ravop.wire import encode_tensor

from test_dashboard import browser  # noqa: F401  (the headless Chromium fixture)


def test_few_points_are_kept_as_they_are():
    assert extremes_per_bucket(np.array([3.0, 1.0, 2.0])).tolist() == [0, 1, 2]


def test_many_points_keep_first_last_and_every_spike_and_dip_in_order():
    values = np.random.default_rng(0).normal(size=75_000)
    values[12_345], values[54_321] = 100.0, -100.0
    kept = extremes_per_bucket(values, 1000)
    assert len(kept) <= 1000 and kept[0] == 0 and kept[-1] == len(values) - 1
    assert 12_345 in kept and 54_321 in kept and np.all(np.diff(kept) > 0)
    edges = np.linspace(0, len(values), 1000 // 2 - 1 + 1).astype(int)
    for start, stop in zip(edges[:-1], edges[1:]):   # each bucket's min and max are drawn
        bucket = values[start:stop]
        inside = values[kept[(kept >= start) & (kept < stop)]]
        assert bucket.min() in inside and bucket.max() in inside


def test_the_curve_skips_steps_not_computed_and_places_validation_at_its_epochs_last_step():
    batch = np.array([1.0, 0.5, np.nan, np.nan])
    losses = Losses("g", "running", batch=batch, epoch=np.array([1, 1, 2, 2]), validation=np.array([0.7, np.nan]))
    assert curve(losses) == {"graph": "g", "state": "running", "steps": 4, "computed": 2,
                             "batch": [[0, 1.0], [1, 0.5]], "last": 0.5, "validation": [[1, 0.7]]}


def plant_fit(client, token, epochs, batches, values):
    """A running graph of `token` whose fit persisted epochs x batches training losses (and one validation
    loss per epoch), as the workers would have stored them."""
    keys = GraphKeys(token, uuid.uuid4().hex[:12])
    client.hset(keys.meta, mapping={"name": "long-fit", "state": graph_states.RUNNING})
    client.zadd(TokenKeys(token).graphs, {keys.graph_id: time.time()})
    pipe = client.pipeline(transaction=False)
    node = 0
    for e in range(1, epochs + 1):
        for b in range(1, batches + 1):
            pipe.hset(keys.persist, training_loss_name(e, b), node)
            pipe.set(keys.tensor(node), encode_tensor(torch.tensor(float(values[node]))))
            node += 1
        pipe.hset(keys.persist, validation_loss_name(e), f"v{e}")
        pipe.set(keys.tensor(f"v{e}"), encode_tensor(torch.tensor(0.5)))
    pipe.execute()
    return keys


def test_a_75000_step_fit_sends_a_thinned_curve(server, client):
    token = f"dash-{uuid.uuid4().hex[:8]}"
    values = np.abs(np.random.default_rng(1).normal(size=75_000)) + 0.1
    values[40_000] = 50.0
    keys = plant_fit(client, token, epochs=75, batches=1000, values=values)
    board = Dashboard(client, token).start()
    try:
        started = time.perf_counter()
        with urllib.request.urlopen(f"{board.url}api/graphs/{keys.graph_id}/losses", timeout=120) as reply:
            body = reply.read()
        seconds = time.perf_counter() - started
    finally:
        board.stop()
    losses = json.loads(body)
    print(f"losses endpoint, 75,000 steps: {len(body)} bytes in {seconds:.2f} s")
    assert losses["steps"] == losses["computed"] == 75_000 and len(losses["batch"]) <= MAX_POINTS
    assert losses["batch"][0] == [0, pytest.approx(values[0])] and losses["batch"][-1][0] == 74_999
    assert [40_000, 50.0] in losses["batch"]
    assert len(losses["validation"]) == 75 and losses["validation"][0] == [999, 0.5]
    assert len(body) < 100_000   # before: every loss and every step's epoch, ~1.5 MB


def test_the_loss_axis_labels_are_inside_the_chart(server, client, browser):  # noqa: F811
    board = Dashboard(client, f"dash-{uuid.uuid4().hex[:8]}").start()
    try:
        browser.get(board.url)
        boxes = browser.execute_script("""
            renderLosses({graph: "g", state: "running", steps: 3, computed: 3, last: -0.0000125,
                          batch: [[0, -0.0000123], [1, -0.0000456], [2, -0.0000125]], validation: []});
            return [...document.querySelectorAll('#loss-plot text')].map(t => {
                const box = t.getBBox(); return [t.textContent, box.x, box.x + box.width]; });
        """)
    finally:
        board.stop()
    assert "-0.0000456" in [text for text, _, _ in boxes]
    for text, start, end in boxes:
        assert 0 <= start and end <= 520, (text, start, end)
