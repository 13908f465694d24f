"""The web dashboard against a real server and worker processes: its JSON endpoints, its read-only default and
admin token, and the page itself in headless Chromium during a real training run (workers, the graph with its
progress, its subgraph DAG and a loss curve that grows while it trains), with a screenshot that must not be
blank. Set RAVOP_SCREENSHOT to a path to keep the screenshot (docs/dashboard.png comes from this test)."""
import json
import os
import shutil
import urllib.error
import urllib.request

import numpy as np
import pytest
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.tools.dashboard import Dashboard

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"  # Debian's chromium, chromium-driver
PAGE_TIMEOUT = 180  # seconds for the page to show a state, on a busy 2-core machine


def request(url, method="GET", token=None):
    """(HTTP status, JSON body)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def record_training(hidden=512, epochs=50):
    """A regression MLP trained long enough (2,000 steps) for the page to see its loss curve grow."""
    R.Graph(name="dashboard-train")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 128)).astype(np.float32)
    y = X[:, :1] * 2 + 1
    model = NeuralNetwork(Adam(lr=0.001), loss="SquareLoss", validation_data=(X[:200], y[:200]))
    model.add(Dense(hidden, input_shape=(128,)))
    model.add(Activation("relu"))
    model.add(Dense(hidden))
    model.add(Activation("relu"))
    model.add(Dense(1))
    return model.fit(X, y, n_epochs=epochs, batch_size=50)


@pytest.fixture
def dashboard(engine):
    board = Dashboard(engine.client, engine.token, admin_token="s3cret").start()
    yield board
    board.stop()


def test_endpoints_are_read_only_without_the_admin_token(server, engine, dashboard, module_workers):
    R.Graph(name="endpoints", gpu_required="yes")  # waits for a GPU worker: stays running
    (R.t(np.ones((80, 80), np.float32)) * 3).persist_op("x")
    R.activate()
    R.execute()
    code, report = request(dashboard.url + "api/status")
    assert code == 200 and report["token"] == engine.token and report["admin"] is True
    assert set(module_workers.procs) <= {w["name"] for w in report["workers"]}
    assert [(g["name"], g["state"]) for g in report["graphs"]] == [("endpoints", "running")]
    code, dag = request(dashboard.url + "api/graphs/endpoints/dag")
    assert code == 200 and [s["state"] for s in dag["subgraphs"]] == ["queued"]
    assert request(dashboard.url + "api/graphs/nosuch/dag")[0] == 404
    cancel = dashboard.url + f"api/graphs/{engine.graph_id}/cancel"
    assert request(cancel, "POST")[0] == 403
    assert request(cancel, "POST", token="wrong")[0] == 403
    read_only = Dashboard(engine.client, engine.token).start()
    try:
        code, body = request(read_only.url + f"api/graphs/{engine.graph_id}/cancel", "POST", token="s3cret")
        assert code == 403 and "read-only" in body["error"]
    finally:
        read_only.stop()
    assert request(dashboard.url + "api/status")[1]["graphs"][0]["state"] == "running"
    assert request(cancel, "POST", token="s3cret") == (200, {"graph": engine.graph_id, "cancelled": True})
    assert request(dashboard.url + "api/status")[1]["graphs"][0]["state"] == "cancelled"
    code, body = request(dashboard.url + "api/graphs/endpoints/failures")
    assert code == 200 and [f["reason"] for f in body["failures"]] == ["cancelled"]
    assert body["failures"][0]["by"].startswith("the dashboard (")


def drawn(png_path):
    """Whether a screenshot shows a drawn page: many colours, and a good share of pixels off the background."""
    image = np.asarray(Image.open(png_path).convert("RGB")).reshape(-1, 3)
    colours = len(np.unique(image, axis=0))
    background = np.bincount(np.ravel_multi_index(image.T, (256, 256, 256))).max()
    return colours > 50 and 1 - background / len(image) > 0.05


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1400,1100"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


# What the page shows, read in one go so that the state and the curve are from the same moment.
READ_PAGE = """
const rows = sel => [...document.querySelectorAll(sel)].map(r => [...r.cells].map(c => c.textContent));
const plot = document.getElementById('loss-plot');
return {workers: rows('#workers tbody tr'), graphs: rows('#graphs tbody tr'),
        points: Number(plot.dataset.points || 0), curve: !!document.getElementById('loss-curve'),
        subgraphs: [...document.querySelectorAll('#dag circle.subgraph')].map(c => c.getAttribute('class')),
        error: document.getElementById('error').textContent,
        resources: performance.getEntriesByType('resource').map(e => e.name)};
"""


def test_page_shows_workers_graph_dag_and_a_growing_loss_curve(engine, workers, dashboard, browser, tmp_path):
    names = workers.start(2)
    history = record_training()
    R.activate()
    R.execute()
    browser.get(dashboard.url + "#admin=s3cret")

    def training_with_losses(driver):
        page = driver.execute_script(READ_PAGE)
        running = [g for g in page["graphs"] if g[0] == "dashboard-train" and g[2] == "running"]
        return page if running and page["curve"] and page["points"] > 0 else None

    first = WebDriverWait(browser, PAGE_TIMEOUT, 0.2).until(training_with_losses)
    assert set(names) <= {row[0] for row in first["workers"]}
    assert all(row[1] == "cpu" for row in first["workers"])
    assert first["error"] == "" and first["subgraphs"]
    assert first["graphs"][0][-1] == "cancel"  # the admin token in the page's address shows the cancel button
    # coloured by state: the training loop's subgraph runs (a fit is one subgraph: its loop makes its own zeros)
    assert any("subgraph-running" in c or "subgraph-done" in c for c in first["subgraphs"])
    assert all(url.startswith(dashboard.url) for url in first["resources"])  # nothing from a CDN
    later = WebDriverWait(browser, PAGE_TIMEOUT, 0.2).until(
        lambda d: (p := training_with_losses(d)) and p["points"] > first["points"] and p)
    assert later["points"] > first["points"]  # the curve grows while the graph trains
    screenshot = tmp_path / "dashboard.png"
    browser.save_screenshot(str(screenshot))
    assert drawn(screenshot)
    if os.environ.get("RAVOP_SCREENSHOT"):
        shutil.copyfile(screenshot, os.environ["RAVOP_SCREENSHOT"])
    R.track_progress(progress_bar=False, timeout=600)
    done = WebDriverWait(browser, PAGE_TIMEOUT, 0.2).until(
        lambda d: (p := d.execute_script(READ_PAGE)) and p["graphs"][0][2] == "done" and p["points"] == len(history)
        and p)  # the state and the curve come from separate polls: wait for the poll that has every point
    assert done["points"] == len(history) and done["graphs"][0][3].endswith("100.0%")
    assert done["subgraphs"] and all("subgraph-done" in c for c in done["subgraphs"])
    assert "cancel" not in done["graphs"][0][-1]  # the admin's cancel button is for graphs still running


def test_screenshot_check_rejects_a_blank_page(browser, tmp_path):
    browser.get("about:blank")
    blank = tmp_path / "blank.png"
    browser.save_screenshot(str(blank))
    assert not drawn(blank)


def test_initialize_with_dashboard_prints_its_url(server, engine, capsys):
    session = R.initialize(token=engine.token, redis_url=server.url, dashboard=True)
    url = capsys.readouterr().out.strip().removeprefix("ravop dashboard: ")
    assert url == session.dashboard.url and url.startswith("http://127.0.0.1:")
    code, report = request(url + "api/status")
    assert code == 200 and report["token"] == engine.token and report["admin"] is False
    R.initialize(token=engine.token, redis_url=server.url)  # a new session stops the old one's dashboard
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "api/status", timeout=5)
    with pytest.raises(ValueError, match="dashboard must be True, False or a port number"):
        R.initialize(token=engine.token, redis_url=server.url, dashboard="yes")
