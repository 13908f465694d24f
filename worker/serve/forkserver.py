"""`python -m worker.serve.forkserver`: one process that imports torch and the worker's modules once, then forks each
embedded worker from itself (`ravop/local/forked_workers.py` drives it). A forked worker costs no import, which takes
1 s on a quiet machine and 2-3 s beside busy processes; the first one is ready as soon as this import is done.

Fork safety: nothing here runs a torch op, so there is no OpenMP thread pool to lose in a child, and each child
sets its own intra-op threads (`ravop-worker --threads`). The OpenMP runtime reads its environment
(OMP_WAIT_POLICY) when torch loads it, so this process is started with the workers' environment.

Protocol, JSON lines on a private pipe. Commands (stdin): {"start": ID, "argv": [...], "log": PATH} forks a
worker running `ravop-worker ARGV --parent-pid <this pid>`, its output appended to PATH; {"signal": ID,
"signum": N} signals a worker not yet reaped. Events (stdout): {"ready": PID} once imported, {"started": ID,
"pid": PID}, {"exited": ID, "code": C} (C < 0: killed by signal -C). End of stdin (its owner stopped or died)
or SIGTERM: every worker gets SIGTERM, SIGKILL after GRACE s, then this process exits. The workers also die
with it (PR_SET_PDEATHSIG via --parent-pid), and it dies with its owner (started by the embedded launcher)."""
import argparse
import gc
import json
import os
import select
import signal
import sys
import time
import traceback
import warnings
from typing import IO, Any, NoReturn, Optional, Sequence

from .parent_death import die_with_parent

_KEPT: list[IO[str]] = []      # the requester's standard streams, in a fork server forked from it
GRACE = 10.0   # seconds a worker may take to finish its subgraph after SIGTERM before it is killed


class ForkServer:
    """Forks workers on the commands read from `commands_fd` and reports on `events_fd` (the protocol above),
    in one thread: SIGCHLD and SIGTERM only wake its select()."""

    def __init__(self, commands_fd: int, events_fd: int) -> None:
        self.commands_fd, self.events_fd = commands_fd, events_fd
        self.running: dict[int, int] = {}   # pid -> command id, until reaped
        self.stopping = False
        self._pending = b""
        self.wake_read, self.wake_write = os.pipe()   # SIGCHLD and SIGTERM wake select() through this
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C reaches the requester, which stops us

    def _stop(self, *_: object) -> None:
        self.stopping = True

    def emit(self, **event: Any) -> None:
        try:
            os.write(self.events_fd, json.dumps(event).encode() + b"\n")
        except OSError:   # the owner is gone: stop
            self.stopping = True

    def serve(self) -> int:
        """Run commands until told to stop, then stop every worker; returns the exit code."""
        self.emit(ready=os.getpid())
        while not self.stopping:
            ready, _, _ = select.select([self.commands_fd, self.wake_read], [], [])
            if self.wake_read in ready:
                self._drain_wakeups()
            self._reap()
            if self.commands_fd in ready:
                self._read_commands()
        self._stop_workers()
        return 0

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_read, 512):
                pass
        except BlockingIOError:
            pass

    def _read_commands(self) -> None:
        chunk = os.read(self.commands_fd, 65536)
        if not chunk:
            self.stopping = True   # the owner closed our stdin or died
            return
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            try:
                self._run(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:   # the owner's bug: say so, serve on
                print(f"ravop fork server: ignored command {line[:200]!r}: {exc}", file=sys.stderr, flush=True)

    def _run(self, command: dict[str, Any]) -> None:
        if "start" in command:
            ident, argv, log = int(command["start"]), [str(a) for a in command["argv"]], str(command["log"])
            pid = self._fork(argv, log)
            self.running[pid] = ident
            self.emit(started=ident, pid=pid)
        elif "signal" in command:
            ident, signum = int(command["signal"]), int(command["signum"])
            for pid, running in self.running.items():   # only unreaped pids: never one the kernel reused
                if running == ident:
                    os.kill(pid, signum)
        else:
            raise KeyError("start or signal")

    def _fork(self, argv: list[str], log: str) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():   # Python 3.12+ warns of any other OS thread: the only ones here are
            warnings.simplefilter("ignore", DeprecationWarning)   # the BLAS pool's, which handles fork itself
            pid = os.fork()
        if pid == 0:
            self._become_worker(argv, log)   # never returns
        return pid

    def _become_worker(self, argv: list[str], log: str) -> NoReturn:
        """In the child: this server's pipes and signal handling undone, output to `log`, then the worker's
        main; always leaves through os._exit (nothing of this server's may run at exit)."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)
            for fd in (self.commands_fd, self.events_fd, self.wake_read, self.wake_write):
                os.close(fd)
            out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
            _name_this_process(b"ravop-worker")
            import torch
            torch.default_generator.seed()   # its own random default, as a fresh process has (not its siblings')
            from .worker_cli import main
            code = main([*argv, "--parent-pid", str(os.getppid())])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:   # noqa: BLE001 - reported in the worker's log, which the requester shows
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def _reap(self) -> None:
        while self.running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ident = self.running.pop(pid, None)
            if ident is not None:
                self.emit(exited=ident, code=os.waitstatus_to_exitcode(status))

    def _stop_workers(self) -> None:
        for pid in self.running:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        while self.running and time.monotonic() < deadline:
            select.select([self.wake_read], [], [], 0.1)
            self._drain_wakeups()
            self._reap()
        for pid in self.running:
            os.kill(pid, signal.SIGKILL)
        while self.running:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:   # none left to wait for
                return
            ident = self.running.pop(pid, None)
            if ident is not None:
                self.emit(exited=ident, code=os.waitstatus_to_exitcode(status))


def _name_this_process(name: bytes) -> None:
    """What `ps -o comm` and top show (Linux): a worker or the fork server, not a copy of its parent's command."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None).prctl(15, name)   # 15 = PR_SET_NAME


def serve_forked(commands_fd: int, events_fd: int, log_fd: int, parent_pid: int) -> NoReturn:
    """Become the fork server in a child just forked from the requester, which had imported torch already (the
    import this saves): what the requester set up for itself is undone (its signal handlers, its logging, its
    descriptors, all closed but the pipes; its atexit handlers never run: this always leaves through os._exit).
    The requester forks here only when no other thread of its own runs and workers run one intra-op thread, so
    neither a lock held by a thread that the fork left behind nor OpenMP's thread pool matters."""
    code = 1
    try:
        _KEPT.extend([sys.stdin, sys.stdout, sys.stderr])   # never finalized here (they would close fds)
        gc.freeze()   # nor anything else of the requester's: the cyclic GC leaves it alone
        for signum in signal.valid_signals():
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        if not die_with_parent(parent_pid):
            os._exit(0)
        _name_this_process(b"ravop-forks")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        keep = sorted({0, 1, 2, commands_fd, events_fd})
        for low, high in zip(keep, keep[1:] + [os.sysconf("SC_OPEN_MAX")]):
            os.closerange(low + 1, high)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        import faulthandler
        import logging
        faulthandler.disable()
        for logger in [logging.root, *logging.Logger.manager.loggerDict.values()]:
            if isinstance(logger, logging.Logger):
                logger.handlers = []   # not closed: their descriptors are gone already
        from . import worker_cli   # noqa: F401 - the worker's own modules, once
        code = ForkServer(commands_fd, events_fd).serve()
    except BaseException:   # noqa: BLE001 - in its log, which the requester shows
        traceback.print_exc()
    finally:
        os._exit(code)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.serve.forkserver", description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process exits")
    args = parser.parse_args(argv)
    if args.parent_pid is not None and not die_with_parent(args.parent_pid):
        return 0
    _name_this_process(b"ravop-forks")
    # The protocol gets private descriptors: whatever an import prints goes to the log (stderr), not into it.
    commands_fd, events_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    import torch   # noqa: F401 - the import every worker would pay
    from . import worker_cli   # noqa: F401 - and the worker's own modules
    gc.collect()
    gc.freeze()    # what is loaded by now stays shared with the workers (no copy-on-write from the cyclic GC)
    return ForkServer(commands_fd, events_fd).serve()


if __name__ == "__main__":
    raise SystemExit(main())
