"""Find the user's source line that recorded an op, skipping frames inside this project's libraries."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
# Frames whose file lies in one of these packages are library frames, not the user's.
LIBRARY_DIRS = tuple(os.path.join(_ROOT, pkg) + os.sep for pkg in ("ravop", "ravdl", "compiler", "worker"))


_is_library = {}  # co_filename -> bool, so the walk costs one dict lookup per frame


def _library(filename):
    hit = _is_library.get(filename)
    if hit is None:
        hit = _is_library[filename] = filename.startswith(LIBRARY_DIRS)
    return hit


def user_source():
    """Return "file:line" of the innermost frame outside the library (cheap: a short frame walk)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        library = _is_library.get(filename)
        if library is None:
            library = _library(filename)
        if not library:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"
