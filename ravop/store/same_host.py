"""A same-host path for big tensors: a requester's big constants (a data set) are also written once to a file in
a private directory, and a worker on the same host, running as the same user, reads them from there instead of
receiving them through the server's socket (188 MB of MNIST: ~0.5 s through Redis, ~0.1 s from the file).

Redis still holds every tensor (`ravop.store.tensors`): remote workers, a cluster, a worker whose host or user
differs, and a file that is gone (the requester exited) all read the chunks as before. The file is a copy the
reader may take instead, never the only one, and the same bytes either way (determinism).

Trust boundary. The reference `{key}:f` ("boot id:name:bytes") is written by the requester on its own graph's
tensor key, so any token user can put any reference on a queue's graph. A worker follows it only if
- the boot id is its own host's (/proc/sys/kernel/random/boot_id), else it reads the chunks;
- the name is `<pid>-<32 hex>`: no separator, no "..", hence nothing outside the directory;
- the directory is `<base>/ravop-<uid>/<digest of the graph's token>`, the worker's own uid and the token of the
  graph being read: a requester can only name files of its own token, written by the worker's own user (each
  level opened without following symlinks, owned by that uid, no group/other access);
- the file is a regular file (opened without following a symlink, non-blocking: a FIFO cannot stall it) owned by
  that uid, of exactly the bytes the tensor's header declares, read in full into the worker's own memory (never
  mapped: a file truncated meanwhile gives a short read, refused, not a SIGBUS).
Anything else is a `WireFormatError` naming what is wrong (the subgraph fails as a bad input); a missing file
means the chunks are read.

$RAVOP_SAME_HOST=off turns the writing side off; $RAVOP_SAME_HOST_DIR moves the base (default /dev/shm, else
the temp dir).
"""
import atexit
import hashlib
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

import torch

from ..errors import WireFormatError
from ..wire.codec import Chunked, raw_bytes

_NAME = re.compile(r"^[0-9]{1,10}-[0-9a-f]{32}$")
_REFERENCE = re.compile(rb"^([0-9a-f-]{36}):([^:]{1,64}):([0-9]{1,20})$")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def reference_key(key: str) -> str:
    return key + ":f"


def host_id() -> Optional[str]:
    """This host's boot id (a random UUID per boot, shared by every process on the host); None if unknown."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return None


def base_dir() -> Path:
    """The user's private directory's parent: $RAVOP_SAME_HOST_DIR, /dev/shm (memory), or the temp dir."""
    configured = os.environ.get("RAVOP_SAME_HOST_DIR")
    if configured:
        return Path(configured)
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def token_dir_name(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def _open_private_dir(parent_fd: Optional[int], name: str, create: bool) -> int:
    """A directory fd, after checking it is a real directory of this uid that no one else may enter."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        os.close(fd)
        raise PermissionError(f"{name} is not a private directory of uid {os.getuid()} "
                              f"(owner {info.st_uid}, mode {stat.filemode(info.st_mode)})")
    return fd


def _open_token_dir(token: str, create: bool) -> int:
    base = os.open(base_dir(), _DIR_FLAGS)
    try:
        user = _open_private_dir(base, f"ravop-{os.getuid()}", create)
    finally:
        os.close(base)
    try:
        return _open_private_dir(user, token_dir_name(token), create)
    finally:
        os.close(user)


def enabled() -> bool:
    return os.environ.get("RAVOP_SAME_HOST", "on").lower() not in ("off", "0", "false", "no")


class Writer:
    """The requester's files of one token, written beside the chunks and removed at `remove_all` (R.flush) or
    at exit; files of dead processes found in the directory are swept when a writer starts."""

    def __init__(self, token: str) -> None:
        self.token, self.host = token, host_id()
        self.names: List[str] = []
        self.dir_fd = _open_token_dir(token, create=True) if self.host else None
        if self.dir_fd is not None:
            self._sweep()

    def write(self, pipe, key: str, tensor: torch.Tensor) -> None:
        """Write `tensor`'s bytes to a new file and queue its reference on `pipe`."""
        name = f"{os.getpid()}-{secrets.token_hex(16)}"
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=self.dir_fd)
        self.names.append(name)
        try:
            data = raw_bytes(tensor)
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
        finally:
            os.close(fd)
        pipe.set(reference_key(key), f"{self.host}:{name}:{tensor.nbytes}")

    def remove_all(self) -> None:
        for name in self.names:
            try:
                os.unlink(name, dir_fd=self.dir_fd)
            except FileNotFoundError:
                pass
        self.names = []

    def _sweep(self) -> None:
        for name in os.listdir(self.dir_fd):
            if _NAME.match(name) and not _alive(int(name.split("-")[0])):
                try:
                    os.unlink(name, dir_fd=self.dir_fd)
                except FileNotFoundError:
                    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_writers: Dict[str, Writer] = {}


def writer(token: str) -> Optional[Writer]:
    """This process's writer for `token`; None where the path is off or unavailable (no boot id, no private
    directory to be had): the chunks alone then carry the tensors."""
    if not enabled():
        return None
    if token not in _writers:
        try:
            made = Writer(token)
        except OSError:
            return None
        if made.dir_fd is None:
            return None
        _writers[token] = made
    return _writers[token]


def remove_files(token: str) -> None:
    """Remove this process's files of `token` (R.flush)."""
    if token in _writers:
        _writers[token].remove_all()


@atexit.register
def _remove_all_files() -> None:
    for made in _writers.values():
        made.remove_all()


def read(client, key: str, head: Chunked, token: str) -> Optional[torch.Tensor]:
    """The tensor `head` declares, from the file its reference names; None where the chunks must be read (no
    reference, another host, the file gone); `WireFormatError` for a reference or file this worker refuses."""
    reference = client.get(reference_key(key))
    if reference is None:
        return None
    match = _REFERENCE.match(reference)
    if match is None:
        raise WireFormatError(f"tensor {key}: malformed same-host reference {reference[:80]!r}")
    host, name, size = match.group(1).decode(), match.group(2).decode(), int(match.group(3))
    if host != host_id():
        return None
    if not _NAME.match(name):
        raise WireFormatError(f"tensor {key}: same-host reference names {name!r}, not a file of the token's "
                              "directory: refused")
    if size != head.nbytes:
        raise WireFormatError(f"tensor {key}: same-host reference declares {size} bytes, its header {head.nbytes}")
    try:
        dir_fd = _open_token_dir(token, create=False)
    except FileNotFoundError:
        return None
    except OSError as exc:   # not private, not a directory, a symlink
        raise WireFormatError(f"tensor {key}: same-host directory refused: {exc}") from None
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:   # a symlink (ELOOP), a directory, ...
            raise WireFormatError(f"tensor {key}: same-host file {name} refused: {exc}") from None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise WireFormatError(f"tensor {key}: same-host file {name} is not a regular file of uid {os.getuid()}")
        if info.st_size != head.nbytes:
            raise WireFormatError(f"tensor {key}: same-host file {name} holds {info.st_size} bytes, its header "
                                  f"declares {head.nbytes}")
        raw = torch.empty(head.nbytes, dtype=torch.uint8)
        view = memoryview(raw.numpy()) if head.nbytes else memoryview(b"")
        have = 0
        while have < head.nbytes:
            got = os.preadv(fd, [view[have:]], have)
            if got == 0:
                raise WireFormatError(f"tensor {key}: same-host file {name} ended after {have} of {head.nbytes} "
                                      "bytes")
            have += got
    finally:
        os.close(fd)
    return raw.view(head.dtype).reshape(head.shape)
