"""What a WAN-lab run owns: a temp dir, the store (a Redis-compatible server on 127.0.0.1 and a unix socket), the
link process (benchmarks.wan.link), the providers (`ravop-worker` processes, each through its own link) and any
network namespace. All of it is removed when the run ends: `Lab` is a context manager, and its cleanup also runs
at exit (atexit) and on SIGTERM/SIGINT; child processes get SIGTERM from the kernel if the harness dies by SIGKILL
(PR_SET_PDEATHSIG), and namespaces carry the harness's pid in their name (`wanlab-<pid>-...`), so a later run
removes those of a harness that is gone (`remove_stale`)."""
import atexit
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from typing import Collection

import redis

from ravop.local.embedded import server_binary, start_worker, stop_processes
from ravop.store.keys import worker_key

ROOT = Path(__file__).resolve().parents[2]   # the repository: benchmarks/wan/lab.py
PREFIX = "wanlab"
START_TIMEOUT = 180   # seconds for a worker to import torch and register, on a busy 2-core machine


def _die_with_parent():
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def _exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def namespaces():
    """Names of the network namespaces on this machine."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale():
    """Remove the namespaces (and their veths) of WAN-lab harnesses that are no longer running."""
    for name in namespaces():
        match = re.fullmatch(rf"{PREFIX}-(\d+)-\w+", name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for match in re.finditer(r"^\d+: (wl(\d+)[ab])[@:]", out, re.M):
        if not os.path.exists(f"/proc/{match.group(2)}"):
            subprocess.run(["ip", "link", "del", match.group(1)], capture_output=True)


class Lab:
    """Resources of one run. Use as `with Lab() as lab:`; `lab.close()` is idempotent."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{os.getpid()}-"))
        self.processes = []          # everything started, stopped in reverse order
        self.namespaces = []
        self.store = self.link = None
        self.workers = {}            # name -> Popen
        self.closed = False
        atexit.register(self.close)
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _on_signal(self, signum, frame):
        self.close()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    # ------------------------------------------------------------------------------------------ the store

    def start_store(self):
        """A private server on 127.0.0.1 (the links' upstream) and a unix socket (the requester's)."""
        self.port = free_port()
        self.socket = str(self.dir / "store.sock")
        command = [server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--unixsocket", self.socket,
                   "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                   "--logfile", str(self.dir / "store.log"), "--maxclients", "1000"]
        self.store = self._spawn(command)
        client = redis.Redis(unix_socket_path=self.socket, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if self.store.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the store did not start: {(self.dir / 'store.log').read_text()[-2000:]}")
                time.sleep(0.05)
        self.client = client
        return f"unix://{self.socket}"

    # ------------------------------------------------------------------------------------------ the links

    def start_links(self, links):
        """The link process with `links` ({name: {"up": spec, "down": spec}}, benchmarks.wan.link); returns
        {name: port}."""
        config = self.dir / "links.json"
        config.write_text(json.dumps({"upstream": ["127.0.0.1", self.port], "links": links}))
        self.link_stats_path = self.dir / "link-stats.json"
        self.link = self._spawn([sys.executable, "-m", "benchmarks.wan.link", str(config), str(self.link_stats_path)],
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 30
        while not self.link_stats_path.exists():
            if self.link.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the link process did not start")
            time.sleep(0.05)
        return {name: stats["port"] for name, stats in self.link_stats()["links"].items()}

    def link_stats(self, fresh=False):
        """The link process's last stats; with `fresh`, written after this call began."""
        asked = time.time()
        while True:
            try:
                stats = json.loads(self.link_stats_path.read_text())
            except (OSError, ValueError):
                stats = None
            if stats is not None and (not fresh or stats["time"] > asked):
                return stats
            time.sleep(0.05)

    def store_link_bytes(self):
        """(bytes in, bytes out) the store counted on the links' connections (those from 127.0.0.1; the requester
        uses the unix socket): the other end of what the links count, for checking them."""
        clients = [c for c in self.client.client_list() if c["addr"].startswith("127.0.0.1:")]
        return sum(int(c["tot-net-in"]) for c in clients), sum(int(c["tot-net-out"]) for c in clients)

    # ------------------------------------------------------------------------------------------ providers

    def start_worker(self, name, port, extra=()):
        """A provider reaching the store at 127.0.0.1:`port` (its link)."""
        log = self.dir / f"{name}.log"
        # Churn kills providers mid-subgraph: allow more deliveries than the default before giving up.
        process = start_worker(f"redis://127.0.0.1:{port}/0", name, threads=1, log_path=str(log),
                               parent_pid=os.getpid(),
                               extra_args=["--max-attempts", "10", *extra])
        self.workers[name] = process
        self.processes.append(process)
        return process

    def wait_registered(self, names):
        deadline = time.monotonic() + START_TIMEOUT
        for name in names:
            while not self.client.exists(worker_key(name)):
                if self.workers[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"provider {name} did not register:\n{self.worker_log(name)}")
                time.sleep(0.1)

    def wait_ready(self, count):
        """Until `count` providers wait for work (their main loops blocked reading the work stream): a provider
        registers before its main loop's first look at the stream, which over a slow link is round trips later,
        and a run started in between would count that start-up as the run's own time."""
        deadline = time.monotonic() + START_TIMEOUT
        while sum(c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "") for c in self.client.client_list()) \
                < count:
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {count} providers wait for work after {START_TIMEOUT} s")
            time.sleep(0.05)

    def check_alive(self, down: Collection[str] = ()) -> None:
        """Raise naming every process of the lab that has exited (the store, the link process, a provider not in
        `down`: those the churn has killed and not restarted yet), with its exit status and log's end. A run
        waits on the graph's progress, which a dead store or link would otherwise stall until the timeout."""
        dead = []
        if self.store is not None and self.store.poll() is not None:
            log = self.dir / "store.log"
            dead.append(f"the store ({_exit(self.store.returncode)}); its log ends:\n"
                        f"{log.read_text(errors='replace')[-1500:] if log.exists() else '(no log)'}")
        if self.link is not None and self.link.poll() is not None:
            dead.append(f"the link process ({_exit(self.link.returncode)})")
        for name, process in list(self.workers.items()):
            if name not in down and process.poll() is not None:
                dead.append(f"provider {name} ({_exit(process.returncode)}); its log ends:\n{self.worker_log(name)}")
        if dead:
            raise RuntimeError("the WAN lab lost " + "\n".join(dead))

    def worker_log(self, name):
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def busy(self, name):
        """A provider's device clock (worker/execute/emulated_device.py), or None before its first unit of work."""
        try:
            return json.loads((self.dir / f"{name}.busy.json").read_text())
        except (OSError, ValueError):
            return None

    def busy_file(self, name):
        return str(self.dir / f"{name}.busy.json")

    # ------------------------------------------------------------------------------------------ namespaces

    def add_namespace(self, suffix):
        name = f"{PREFIX}-{os.getpid()}-{suffix}"
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        self.namespaces.append(name)
        return name

    # ------------------------------------------------------------------------------------------ the end

    def _spawn(self, command, **kwargs):
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent, **kwargs)
        self.processes.append(process)
        return process

    def close(self):
        if self.closed:
            return
        self.closed = True
        stop_processes(list(reversed(self.processes)), timeout=10)
        for name in self.namespaces:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        for sig, handler in getattr(self, "_previous", {}).items():
            signal.signal(sig, handler)
        atexit.unregister(self.close)
