"""The requester's side of the embedded workers' fork server (`worker/serve/forkserver.py`): it starts the server
process, asks it for workers, and hands back a `ForkedWorker` per worker that the embedded cluster owns and
stops as it would a `subprocess.Popen` (poll, wait, terminate, kill, pid, returncode).

A worker is the fork server's child, not ours: its exit status comes through the server's pipe, and a signal
goes through the server too, which signals only a worker it has not reaped (so never a reused pid). If the fork
server dies, its workers die with it (PR_SET_PDEATHSIG) and every one not reported yet counts as exited.

The fork server is normally this process's own child, forked from it: the requester imported torch already,
so no worker waits for that import (2-3 s beside busy processes). Only where that is safe (`can_fork_here`):
CPU workers running one intra-op thread each (a fork loses OpenMP's thread pool if this process ever ran a
parallel region, and OpenMP read its wait policy from this process's environment), no other thread here.
Elsewhere it is a fresh `python -m worker.serve.forkserver`, which imports torch once for all the workers.

RAVOP_FORK_SERVER=spawn always starts a fresh one; =0 (and no os.fork, as on Windows) starts each worker as its
own process."""
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings

FORK_SERVER_ENV = "RAVOP_FORK_SERVER"
FORK_SERVER_MODULE = "worker.serve.forkserver"   # the fork server's program: `python -m` runs it
LOST = -255   # the exit code of a worker whose fork server died before reporting it


def _mode():
    return os.environ.get(FORK_SERVER_ENV, "auto").strip().lower()


def available():
    """Whether embedded workers are forked from a fork server here (os.fork exists and the user did not say 0)."""
    return hasattr(os, "fork") and _mode() not in ("0", "no", "false", "off")


def can_fork_here(threads, device="cpu"):
    """Whether the fork server may be forked from this process, for workers of `threads` intra-op threads on
    `device` (CPU only: CUDA, if this process has used it, cannot be used in a forked child)."""
    return (available() and _mode() != "spawn" and sys.platform.startswith("linux") and threads == 1
            and device == "cpu" and threading.active_count() == 1)


class ForkedWorker:
    """One worker forked by a `ForkServer`, with the part of the Popen interface the embedded cluster uses."""

    def __init__(self, server, ident, argv):
        self.server, self.ident, self.args = server, ident, argv
        self._pid = None
        self.returncode = None
        self._started = threading.Event()
        self._exited = threading.Event()

    @property
    def pid(self):
        """Its process id, once the fork server has forked it (it first imports torch); None if it never will."""
        while not self._started.wait(0.05):
            if self.server.process.poll() is not None and not self.server.reading:
                break
        return self._pid

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum):
        if self.returncode is None:
            self.server.send({"signal": self.ident, "signum": int(signum)})

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def _on_start(self, pid):
        self._pid = pid
        self._started.set()

    def _on_exit(self, code):
        if self.returncode is None:
            self.returncode = code
        self._started.set()
        self._exited.set()


class _ChildHere:
    """The Popen interface (that ForkServer uses) of a child this process forked itself: its pipes, and its exit
    status from os.waitpid."""

    def __init__(self, pid, commands_fd, events_fd):
        self.pid = pid
        self.stdin, self.stdout = os.fdopen(commands_fd, "wb"), os.fdopen(events_fd, "rb")
        self.returncode = None
        self._reaping = threading.Lock()

    def poll(self):
        with self._reaping:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:   # collected by someone else (a subreaper's sweep): gone, status unknown
                    pid, status = self.pid, None
                if pid:
                    self.returncode = LOST if status is None else os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["fork server", str(self.pid)], timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self):
        if self.poll() is None:   # not reaped: the pid is still its own
            os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """A fork server (`worker/serve/forkserver.py`) that `process` runs, its own output appended to `log`: `spawned`
    or `forked_here`."""

    @classmethod
    def spawned(cls, command, env, log):
        """`command` (which runs `python -m worker.serve.forkserver`) started with `env`."""
        with open(log, "ab") as out:
            process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out)
        return cls(process, log)

    @classmethod
    def forked_here(cls, env, log, root):
        """Forked from this process, then running with `env` as its environment and `root` first on its path
        (the checkout whose `worker` package this `ravop` goes with)."""
        commands_read, commands_write = os.pipe()
        events_read, events_write = os.pipe()
        log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        for stream in (sys.stdout, sys.stderr):   # nothing buffered here may be written twice
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        parent = os.getpid()
        with warnings.catch_warnings():   # Python 3.12+ warns of any other OS thread: here only native pools
            warnings.simplefilter("ignore", DeprecationWarning)   # (BLAS, OpenMP), safe as can_fork_here says
            pid = os.fork()
        if pid == 0:   # the fork server: whatever happens, this child never returns into the requester's code
            try:
                os.environ.clear()
                os.environ.update(env)
                sys.path.insert(0, root)
                os.close(commands_write)
                os.close(events_read)
                # The child becomes the worker's program, as `python -m` would start it: the requester's own
                # process never imports the worker (a program it starts by name, docs/developers/layout.md).
                program = importlib.import_module(FORK_SERVER_MODULE)
                program.serve_forked(commands_read, events_write, log_fd, parent)
            except BaseException:   # noqa: BLE001 - said in its log; the requester reports it exited
                os.write(log_fd, traceback.format_exc().encode())
            finally:
                os._exit(1)
        for fd in (commands_read, events_write, log_fd):
            os.close(fd)
        return cls(_ChildHere(pid, commands_write, events_read), log)

    def __init__(self, process, log):
        self.process = process
        self.log = log
        self.pid = self.process.pid
        self.ready_at = None   # time.monotonic() when it had imported torch and the worker, if it has
        self._workers = {}   # ident -> ForkedWorker
        self._writing = threading.Lock()
        self.reading = True
        threading.Thread(target=self._read_events, name="ravop-fork-server-events", daemon=True).start()

    def fork(self, argv, log):
        """A `ForkedWorker` running `ravop-worker ARGV` (the server adds --parent-pid), output appended to `log`."""
        with self._writing:
            ident = len(self._workers)
            worker = self._workers[ident] = ForkedWorker(self, ident, argv)
        if self.process.poll() is not None or not self.send({"start": ident, "argv": list(argv), "log": log}):
            worker._on_exit(LOST if self.process.returncode is None else self.process.returncode)
        return worker

    def send(self, command):
        """Write `command` to the server; False if it is gone."""
        line = json.dumps(command).encode() + b"\n"
        with self._writing:
            try:
                self.process.stdin.write(line)
                self.process.stdin.flush()
                return True
            except (OSError, ValueError):   # a broken pipe, or closed by stop()
                return False

    def _read_events(self):
        try:
            for line in self.process.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if "ready" in event:
                    self.ready_at = time.monotonic()
                elif "started" in event and event["started"] in self._workers:
                    self._workers[event["started"]]._on_start(event["pid"])
                elif "exited" in event and event["exited"] in self._workers:
                    self._workers[event["exited"]]._on_exit(event["code"])
        finally:
            self.process.wait()
            for worker in list(self._workers.values()):
                worker._on_exit(LOST)   # died with their server, unreported (no-op for those reported)
            self.reading = False

    def stop(self, timeout=30):
        """Close the server's commands (it then stops its workers and exits) and wait for it; kill it after
        `timeout` s, which takes its workers with it (their parent-death signal)."""
        with self._writing:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
