"""How this project's clients pack commands for the socket.

redis-py packs with hiredis when it is installed, which copies every value twice (bytes(view), then the packed
command) and a whole pipeline before sending it. Its pure-Python packer sends a large value or a memoryview as it
is: tensor chunks go from the tensor's memory to the socket (measured on 100 MB in 4 MiB chunks: 0.04 s instead of
0.13-0.3 s to write). But it encodes every argument in Python, ~0.5 us each: R.flush's UNLINK of a fit's 560 keys
took 0.3 ms to pack, a plan's upload as much again. So a command whose arguments are all small plain values goes
to hiredis's C packer (4x faster), and one that carries a large value or a buffer to the pure-Python one. Both
write the same bytes: hiredis writes an int or a float by its repr(), as redis-py's Encoder does; any other type
(a bool, a numpy number, a bytearray) takes the pure-Python path, which accepts or refuses it as redis-py does.
"""
from typing import Any, List

import hiredis
from redis.connection import Encoder, PythonRespSerializer

BUFFER_CUTOFF = 6000   # redis-py's: larger values are sent as pieces of their own, not copied into the buffer

_SMALL_TYPES = (str, int, float)


class CommandPacker:
    """A redis-py `command_packer`: `pack(*args)` -> the command's RESP bytes, as a list of pieces."""

    def __init__(self, cutoff: int = BUFFER_CUTOFF) -> None:
        self.cutoff = cutoff
        self.zero_copy = PythonRespSerializer(cutoff, Encoder("utf-8", "strict", False).encode)

    def pack(self, *args: Any) -> List[Any]:
        cutoff = self.cutoff
        for arg in args:
            kind = type(arg)
            if kind is bytes:
                if len(arg) > cutoff:
                    return self.zero_copy.pack(*args)
            elif kind is Joined:
                return self._pack_joined(args)
            elif kind not in _SMALL_TYPES:   # exact types: a bool or an np.float64 is packed as redis-py does
                return self.zero_copy.pack(*args)
        name = args[0]   # 'CONFIG GET' is two arguments, as redis-py splits it
        if type(name) is str:
            if " " in name:
                args = tuple(name.encode().split()) + args[1:]
        elif b" " in name:
            args = tuple(name.split()) + args[1:]
        return [hiredis.pack_command(args)]

    def _pack_joined(self, args: tuple) -> List[Any]:
        """`pack` of a command with a `Joined` value: each piece of it goes to the socket as it is, as a large
        value or a memoryview does in redis-py's pure-Python packer (whose layout this follows)."""
        name = args[0]
        if type(name) is str or b" " in name:   # 'CONFIG GET' is two arguments, as redis-py splits it
            args = tuple((name.encode() if type(name) is str else name).split()) + args[1:]
        output, buff = [], b"*%d\r\n" % len(args)
        for arg in args:
            pieces = arg.pieces if type(arg) is Joined else (self.zero_copy.encode(arg),)
            size = sum(memoryview(piece).nbytes for piece in pieces)
            if size > self.cutoff or any(type(piece) is not bytes for piece in pieces):
                output.append(buff + b"$%d\r\n" % size)
                output.extend(pieces)
                buff = b"\r\n"
            else:
                buff = b"".join((buff, b"$%d\r\n" % size, *pieces, b"\r\n"))
        output.append(buff)
        return output


class Joined:
    """One value made of `pieces` (bytes or buffers) sent one after the other, never joined in memory: a tensor's
    header and its data (`ravop.store.tensors.write`), where joining them copied the data once more (a loop's
    whole checkpoint of tensors under the chunk size, held until its pipeline was sent: issue 46). The pieces
    must not change until the command is sent."""
    __slots__ = ("pieces", "nbytes")

    def __init__(self, *pieces: Any) -> None:
        self.pieces = pieces
        self.nbytes = sum(memoryview(piece).nbytes for piece in pieces)
