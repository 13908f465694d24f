"""The requester's side of the embedded workers' fork server (`worker/forkserver.py`): it starts the server
process, asks it for workers, and hands back a `ForkedWorker` per worker that the embedded cluster owns and
stops as it would a `subprocess.Popen` (poll, wait, terminate, kill, pid, returncode).

A worker is the fork server's child, not ours: its exit status comes through the server's pipe, and a signal
goes through the server too, which signals only a worker it has not reaped (so never a reused pid). If the fork
server dies, its workers die with it (PR_SET_PDEATHSIG) and every one not reported yet counts as exited.

Off with RAVOP_FORK_SERVER=0, and where there is no os.fork (Windows): each worker is then its own process."""
import json
import os
import subprocess
import threading
import time

FORK_SERVER_ENV = "RAVOP_FORK_SERVER"
LOST = -255   # the exit code of a worker whose fork server died before reporting it


def available():
    """Whether embedded workers are forked from a fork server here (os.fork exists and the user did not say 0)."""
    return hasattr(os, "fork") and os.environ.get(FORK_SERVER_ENV, "1").strip().lower() not in ("0", "no", "false",
                                                                                                  "off")


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
        self.send_signal(15)

    def kill(self):
        self.send_signal(9)

    def _on_start(self, pid):
        self._pid = pid
        self._started.set()

    def _on_exit(self, code):
        if self.returncode is None:
            self.returncode = code
        self._started.set()
        self._exited.set()


class ForkServer:
    """`command` (which runs `python -m worker.forkserver`) started with `env`, its own output appended to `log`."""

    def __init__(self, command, env, log):
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=out)
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
