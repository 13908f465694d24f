"""A same-host path for big tensors: a requester's big constants (a data set) are also written once to a sealed
memory file (memfd) its process holds, and a worker on the same host, running as the same user, maps that file
instead of receiving the tensor through the server's socket: no copy at all (188 MB of MNIST: ~0.4 s through
Redis, ~0.01 s mapped), and no second copy in the worker's memory.

Not the data a loop streams (an unshuffled fit's array: `ravop.store.row_stream`), which every worker reads from
the store a window at a time: the host then holds it twice (the requester's and the server's), not three times.

Redis still holds every tensor (`ravop.store.tensors`): remote workers, a cluster, a worker of another host or
user, and a file that is gone (the requester exited) all read the chunks as before. The file is a copy the
reader may take instead, never the only one, and the same bytes either way (determinism). The chunks of a
constant that has a file are sent from that file after the graph has started (`ravop.store.background_upload`),
which closes the file once they are all sent; the file of a persisted constant stays open until R.flush.

Trust boundary. The reference `{key}:f` ("boot id:pid:fd:nonce:bytes") is written by the requester on its own
graph's tensor key, so any token user can put any reference on a queue's graph. A worker
- reads the chunks where the boot id is not its host's (/proc/sys/kernel/random/boot_id), where the kernel does
  not let it open `/proc/<pid>/fd/<fd>` (another user's process: the same check as ptrace's), and where that is
  not the memfd named `ravop-<digest of the graph's token>-<nonce>` (a requester gone, its pid reused, or a
  reference to any other file): it names no path, and the name is checked before opening (so no other file is
  opened) and again on the opened descriptor (so a swap in between is caught);
- refuses, with a `WireFormatError` naming the problem (the subgraph fails as a bad input), a malformed
  reference, a size other than the tensor header's, and a file of that name that is not a regular file of the
  worker's uid of exactly that size, sealed against shrinking, growing and writing (F_SEAL_SHRINK, _GROW,
  _WRITE). The seals are why mapping is safe: the file can never be truncated under the mapping (no SIGBUS) nor
  changed (the bytes stay those of the chunks); the mapping is private, so an in-place op only copies a page.
$RAVOP_SAME_HOST=off turns the path off: a requester writes no file, a worker maps none.
"""
import hashlib
import mmap
import os
import re
import secrets
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Mapping, Optional

import torch

from ..core.errors import WireFormatError
from ..wire.codec import Chunked, raw_bytes
from .client_types import Client

try:
    import fcntl
    SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
except (ImportError, AttributeError):   # no file seals on this system (Windows, macOS): the chunks only
    # the module is absent: it is tested for None before any use
    fcntl, SEALS = None, 0  # type: ignore[assignment]

_REFERENCE = re.compile(rb"^([0-9a-f-]{36}):([0-9]{1,10}):([0-9]{1,10}):([0-9a-f]{32}):([0-9]{1,20})$")
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def reference_key(key: str) -> str:
    return key + ":f"


def host_id() -> Optional[str]:
    """This host's boot id (a random UUID per boot, shared by every process on the host); None if unknown."""
    try:
        with open(_BOOT_ID) as file:
            return file.read().strip()
    except OSError:
        return None


def file_name(token: str, nonce: str) -> str:
    """The memfd's name: the graph's token (as a digest) and the reference's nonce."""
    return f"ravop-{hashlib.sha256(token.encode()).hexdigest()[:32]}-{nonce}"


def _on() -> bool:
    return os.environ.get("RAVOP_SAME_HOST", "on").lower() not in ("off", "0", "false", "no")


def enabled() -> bool:
    return _on() and fcntl is not None and hasattr(os, "memfd_create") and host_id() is not None


class Writer:
    """This process's sealed memory files of one token, open until `close` (a deferred constant's chunks all sent,
    ravop.store.background_upload), `remove_all` (R.flush) or the process's exit: nothing is left behind on any host
    when a requester ends, however it ends."""

    def __init__(self, token: str) -> None:
        self.token, self.host = token, host_id()
        self.fds: Dict[str, int] = {}   # reference -> its file's descriptor

    def write(self, tensor: torch.Tensor) -> str:
        """Write `tensor`'s bytes to a new sealed memfd; its reference (the value of `reference_key`)."""
        nonce = secrets.token_hex(16)
        fd = os.memfd_create(file_name(self.token, nonce), os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            data = raw_bytes(tensor)
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS | fcntl.F_SEAL_SEAL)
        except OSError:
            os.close(fd)
            raise
        reference = f"{self.host}:{os.getpid()}:{fd}:{nonce}:{tensor.nbytes}"
        self.fds[reference] = fd
        return reference

    def close(self, reference: str) -> None:
        """Close the file `reference` (one `write` returned) names, if still open."""
        fd = self.fds.pop(reference, None)   # by reference: a reused fd number is another file
        if fd is not None:
            os.close(fd)

    def remove_all(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


_writers: Dict[str, Writer] = {}


def writer(token: str) -> Optional[Writer]:
    """This process's writer for `token`; None where the path is off or unavailable (no memfd, no boot id):
    the chunks alone then carry the tensors."""
    if not enabled():
        return None
    return _writers.setdefault(token, Writer(token))


def start_writing(token: str, big: Mapping[str, torch.Tensor]) -> Callable[[], Dict[str, str]]:
    """Write the files of `big` (tensor key -> tensor) on a thread while the caller uploads other values (both
    wait on the kernel, not the GIL); the returned function waits for them and gives {reference key:
    reference} to set ({} where the path is off)."""
    files = writer(token) if big else None
    if files is None:
        return dict
    pool = ThreadPoolExecutor(1, thread_name_prefix="ravop-same-host")
    written = pool.submit(_write_all, files, big)
    pool.shutdown(wait=False)
    return written.result


def _write_all(files: Writer, big: Mapping[str, torch.Tensor]) -> Dict[str, str]:
    references = {}
    for key, tensor in big.items():
        try:
            references[reference_key(key)] = files.write(tensor)
        except OSError:   # no memory left for the file (tmpfs limits): the chunks carry this one
            continue
    return references


def sealed_bytes(reference: str) -> memoryview:
    """The bytes of this process's file that `reference` (one `Writer.write` returned) names, mapped read-only:
    sealed, they are the bits every reader maps, whatever happens to the tensor they were copied from."""
    match = _REFERENCE.match(reference.encode())
    if match is None or int(match.group(2)) != os.getpid():
        raise ValueError(f"not a same-host reference of this process: {reference!r}")
    return memoryview(mmap.mmap(int(match.group(3)), int(match.group(5)), flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ))


def close_file(reference: str) -> None:
    """Close this process's file that `reference` names (its constant's chunks are all in the server): workers that
    mapped it keep their mapping, later readers read the chunks."""
    for files in _writers.values():
        files.close(reference)


def remove_files(token: str) -> None:
    """Close this process's files of `token` (R.flush): workers that mapped one keep their mapping."""
    if token in _writers:
        _writers[token].remove_all()


UNREAD = object()   # a reference not read yet (None: read, and there is none)


def read(client: Client, key: str, head: Chunked, token: str, reference: Any = UNREAD) -> Optional[torch.Tensor]:
    """The tensor `head` declares, mapped from the file its reference names; None where the chunks must be read
    (no reference, another host or user, the file gone); `WireFormatError` for a reference or file refused.
    `reference`: the value of `reference_key(key)` where the caller read it already (in a round trip it made
    anyway: worker/loops/loop_start.py)."""
    if fcntl is None or not _on():
        return None
    if reference is UNREAD:
        reference = client.get(reference_key(key))
    if reference is None:
        return None
    match = _REFERENCE.match(reference)
    if match is None:
        raise WireFormatError(f"tensor {key}: malformed same-host reference {reference[:80]!r}")
    host, pid, number, nonce, size = (part.decode() for part in match.groups())
    if host != host_id():
        return None
    if int(size) != head.nbytes:
        raise WireFormatError(f"tensor {key}: same-host reference declares {size} bytes, its header {head.nbytes}")
    expected = f"/memfd:{file_name(token, nonce)} (deleted)"
    link = f"/proc/{int(pid)}/fd/{int(number)}"
    try:
        if os.readlink(link) != expected:
            return None   # not this token's file of that nonce: nothing is opened
        fd = os.open(link, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:   # gone, or a process the kernel does not let this user look into
        return None
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != expected:
            return None   # swapped between the check and the open
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size != head.nbytes:
            raise WireFormatError(f"tensor {key}: same-host file is not a regular file of uid {os.getuid()} of "
                                  f"{head.nbytes} bytes ({info.st_size} bytes, uid {info.st_uid})")
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS != SEALS:
            raise WireFormatError(f"tensor {key}: same-host file is not sealed against shrinking, growing and "
                                  "writing: refused (a mapped file cut short would kill the reader)")
        mapped = mmap.mmap(fd, head.nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    # Private and writable: no copy now, a page copied only if an op writes in place. Not MAP_POPULATE, which
    # on a private writable mapping copies every page at once.
    return torch.frombuffer(mapped, dtype=torch.uint8).view(head.dtype).reshape(head.shape)
