"""Find the user's source line that recorded an op, skipping frames inside this project's libraries."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
# Frames whose file lies in one of these packages are library frames, not the user's.
LIBRARY_DIRS = tuple(os.path.join(_ROOT, pkg) + os.sep for pkg in ("ravop", "ravdl", "compiler", "worker"))

# co_filename -> None for a library file, else that user file's {line: "file:line"}: the walk costs one
# dict lookup per frame, and a line recording many ops (a loop) shares one string instead of formatting it
# for each op. Both stay as small as the code that runs.
_lines_of = {}


def _classify(filename):
    lines = _lines_of[filename] = None if filename.startswith(LIBRARY_DIRS) else {}
    return lines


def user_source(depth=1):
    """Return "file:line" of the innermost frame outside the library (cheap: a short frame walk), starting
    `depth` frames up (1: the caller's frame; a caller that knows it is library code may skip itself)."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        lines = _lines_of.get(filename, _classify)
        if lines is _classify:
            lines = _classify(filename)
        if lines is not None:
            line = frame.f_lineno
            text = lines.get(line)
            if text is None:
                text = lines[line] = f"{filename}:{line}"
            return text
        frame = frame.f_back
    return "<unknown>"
