"""Find the user's source line that recorded an op, skipping frames inside this project's libraries."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))   # ravop/record -> the folder holding the packages
# Frames whose file lies in one of these packages are library frames, not the user's.
LIBRARY_DIRS = tuple(os.path.join(_ROOT, pkg) + os.sep for pkg in ("ravop", "ravdl", "compiler", "worker"))

# id(code) -> (code, None) for the library's code, (code, {instruction offset: "file:line"}) for the user's: the
# walk costs one dict lookup per frame, and each recording site's line is worked out once (frame.f_lineno scans
# the code's line table from its start: 14 us per op at line 3,000 of a script's top level). Holding the code
# object keeps its id from being reused by another one while its entry exists. Cleared when it grows past
# _MAX_SITES (a notebook runs its cells as new code objects each time).
_sites = {}
_MAX_SITES = 100_000


def _site(code):
    if len(_sites) >= _MAX_SITES:
        _sites.clear()
    site = _sites[id(code)] = (code, None if code.co_filename.startswith(LIBRARY_DIRS) else {})
    return site


def user_source(depth=1):
    """Return "file:line" of the innermost frame outside the library (cheap: a short frame walk), starting
    `depth` frames up (1: the caller's frame; a caller that knows it is library code may skip itself)."""
    frame = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        site = _sites.get(id(code))
        lines = (site or _site(code))[1]
        if lines is not None:
            offset = frame.f_lasti
            text = lines.get(offset)
            if text is None:
                text = lines[offset] = f"{code.co_filename}:{frame.f_lineno}"
            return text
        frame = frame.f_back
    return "<unknown>"
