"""Two busy processes sharing the machine's cores (a pure-Python loop and a PyTorch matmul loop on torch's
default threads), as on a user's laptop or a provider's shared machine; and the load average to print beside
a figure. Used by bench_contention.py and bench_startup.py."""
import contextlib
import os
import subprocess
import sys
import time

BUSY_PYTHON = "while True: sum(i * i for i in range(10_000))"
BUSY_TORCH = ("import torch\nx = torch.randn(512, 512)\n"
              "while True: x = torch.tanh(x @ x)")


def load():
    return "load %.1f %.1f %.1f" % os.getloadavg()


@contextlib.contextmanager
def busy_processes():
    """Two processes keeping the cores busy while the block runs."""
    processes = [subprocess.Popen([sys.executable, "-c", code]) for code in (BUSY_PYTHON, BUSY_TORCH)]
    try:
        time.sleep(2)   # both running at full speed
        yield
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait()
