"""No test process outlives the test run: servers, workers and requester scripts that tests start die with
it, however the run ends (teardown, a per-test timeout, Ctrl-C, SIGTERM, even SIGKILL of pytest).

Three layers, installed by tests/conftest.py:
- every process spawned from the main thread gets PR_SET_PDEATHSIG (SIGTERM): the kernel stops it when
  pytest dies, even of SIGKILL, when no Python code runs any more (a requester's embedded server and
  workers then follow it through the library's own parent-death handling);
- a process a test body started (the call phase, not a fixture) that still runs after the test's teardown is
  stopped then, with its descendants: a test that timed out or failed before its own clean-up leaks nothing;
- pytest is a child subreaper, so an orphaned grandchild comes back to it, and at the end of the run (and on
  SIGTERM) every descendant still running is stopped.
Linux-only parts are skipped elsewhere, where only the end-of-run sweep by process id applies."""
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE = 5.0  # seconds between SIGTERM and SIGKILL: a worker or server exits in well under one when quiet

_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
_pytest_pid = os.getpid()
_started_in_call = []  # Popen objects a test body started, stopped at the end of that test
_in_call = False
_SIGTERM = int(signal.SIGTERM)  # a plain int: the child calls prctl between fork and exec, with no conversion
_spawned = set()  # pids of pytest's own Popen children: their Popen objects collect their exit status


def _die_with_pytest():
    """Runs in the child between fork and exec: SIGTERM when pytest dies (also if it already has)."""
    _prctl(PR_SET_PDEATHSIG, _SIGTERM)
    if os.getppid() != _pytest_pid:
        os._exit(1)


def _tracked_init(original):
    def __init__(self, *args, **kwargs):
        # The kernel sends the signal when the spawning *thread* exits: only the main thread lives as long
        # as pytest. An explicit preexec_fn or start_new_session is the caller's business.
        if (_prctl is not None and os.getpid() == _pytest_pid and kwargs.get("preexec_fn") is None
                and not kwargs.get("start_new_session") and threading.current_thread() is threading.main_thread()):
            kwargs["preexec_fn"] = _die_with_pytest
        original(self, *args, **kwargs)
        _spawned.add(self.pid)
        if _in_call and os.getpid() == _pytest_pid:
            _started_in_call.append(self)
    return __init__


def install():
    """Make pytest a subreaper, give its children a parent-death signal, and stop everything on SIGTERM."""
    global _pytest_pid
    _pytest_pid = os.getpid()
    if _prctl is not None:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if not getattr(subprocess.Popen.__init__, "_reaper", False):
        patched = _tracked_init(subprocess.Popen.__init__)
        patched._reaper = True
        subprocess.Popen.__init__ = patched
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _reap_and_die)


def _reap_and_die(signum, frame):
    reap_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _processes():
    """(pid, state, ppid) of every process, from /proc."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            yield int(entry), fields[0], int(fields[1])


def children_by_parent():
    """{ppid: [pid, ...]} of every live (not zombie) process."""
    tree = {}
    for pid, state, parent in _processes():
        if state != "Z":
            tree.setdefault(parent, []).append(pid)
    return tree


def descendants(pid, tree=None):
    """Every live process below `pid`, parents before their children."""
    tree = children_by_parent() if tree is None else tree
    found, queue = [], list(tree.get(pid, ()))
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue.extend(tree.get(child, ()))
    return found


def alive(pid):
    """Whether `pid` runs (an exited process that nobody has waited for yet, a zombie, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop(pids, grace=GRACE):
    """SIGTERM `pids`, then SIGKILL those still running after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        pids = [pid for pid in pids if alive(pid)]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)


def reap_adopted_zombies():
    """Collect the exit status of orphans that died under pytest (no Popen waits for them), never one of
    pytest's own Popen children: stealing a Popen's status would fake its return code. Only at the end of the
    run: a multiprocessing child of a running test would lose its status too."""
    for pid, state, parent in _processes():
        if state == "Z" and parent == os.getpid() and pid not in _spawned:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def begin_call():
    """From now on until `end_call`, a process started here belongs to the running test's body."""
    global _in_call
    _in_call = True


def end_call():
    global _in_call
    _in_call = False


def stop_test_processes():
    """Stop what the finished test's body started and left running, with their descendants."""
    procs, _started_in_call[:] = list(_started_in_call), []
    running = [proc for proc in procs if proc.poll() is None]
    if not running:
        return []
    tree = children_by_parent()
    pids = []
    for proc in running:
        pids += [proc.pid, *descendants(proc.pid, tree)]
    stop(pids)
    for proc in running:
        try:
            proc.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            pass
    return pids


def reap_all():
    """Stop every process still running below pytest (adopted orphans included); returns their pids."""
    if os.getpid() != _pytest_pid or not os.path.isdir("/proc"):
        return []
    pids = descendants(os.getpid())
    stop(pids)
    reap_adopted_zombies()
    return pids
