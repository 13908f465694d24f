"""Take docs/metrics.png (the dashboard's /metrics text during a training run, as a browser shows it) and
docs/tensorboard.png (TensorBoard's scalars of the same run, written by the TensorBoard callback), both in headless
Chromium. Needs Debian's chromium and chromium-driver, and the dev extra.

    python scripts/operations_screenshots.py [OUT_DIR]      # default: docs/
"""
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from ravdl.v2 import NeuralNetwork
from ravdl.v2.callbacks import TensorBoard
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.tools.dashboard import Dashboard

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def browser(profile):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_http(url, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main(out):
    work = pathlib.Path(tempfile.mkdtemp(prefix="ravop-shots-"))
    session = R.initialize(token=f"screenshots-{int(time.time())}")   # only this run's graph in the views
    board = Dashboard(session.client, session.token).start()
    R.Graph(name="mlp")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 32)).astype(np.float32)
    y = X[:, :1] * 2 - X[:, 1:2] + 1
    model = NeuralNetwork(Adam(lr=0.0005), loss="SquareLoss", validation_data=(X[:200], y[:200]))
    model.add(Dense(256, input_shape=(32,)))
    model.add(Activation("relu"))
    model.add(Dense(1))
    model.fit(X, y, n_epochs=100, batch_size=50, callbacks=[TensorBoard(work / "runs" / "mlp")])
    R.activate()
    R.execute()
    driver = browser(work / "profile")
    try:
        time.sleep(3)   # mid-run: the graph is running, its losses moving
        driver.get(board.url + "metrics")
        driver.save_screenshot(str(out / "metrics.png"))
        R.track_progress()
        port = 6006
        tensorboard = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(work / "runs"),
                                        "--port", str(port), "--host", "127.0.0.1"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_http(f"http://127.0.0.1:{port}/")
            driver.get(f"http://127.0.0.1:{port}/#scalars")
            time.sleep(15)   # the page loads its runs and draws the charts
            driver.save_screenshot(str(out / "tensorboard.png"))
        finally:
            tensorboard.terminate()
            tensorboard.wait()
    finally:
        driver.quit()
        board.stop()


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs"))
