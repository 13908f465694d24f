"""A TorchScript archive whose bytes are a function of the module's code alone, not of the process that saved it.

`torch.jit.script` gathers a module's constants (its `Final[...]` annotations and `__constants__`) in a Python set,
so the order their declarations take in the saved code follows the process's string hash (PYTHONHASHSEED,
random per process), and torch's `.data/serialization_id` is a digest of the records, so it changes with them.
`R.model(module)` then made other bytes in every process: another `model_hash`, and a miss in the worker's cache of
checked archives (worker/execute/model_verdicts.py) on every run. Sorting each class's constant declarations
(their order means nothing to TorchScript) and saving the loaded result again gives one archive per module code.
"""
import io
import re
import zipfile

# A class-level constant as torch's code printer writes it: two spaces, a name, ` : Final[`; one line each (a
# string value is printed escaped). Method bodies are indented further, so they never match.
_CONSTANT = re.compile(rb"  [A-Za-z_]\w* : Final\[")
_EPOCH = (1980, 1, 1, 0, 0, 0)   # the zip format's earliest time: no clock in the rewritten entries


def sorted_constants(data: bytes) -> bytes:
    """Archive bytes `data` (`torch.jit.save`'s) with each run of constant declarations in a code file sorted.

    The bytes before and after a run keep their offsets (a run sorted keeps its length), so the code's debug
    records, which point into it by offset, stay right. The result is meant to be loaded and saved again by
    torch (its own record layout and serialization id); the rewritten zip stores every entry uncompressed."""
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            record = source.read(info)
            if "/code/" in info.filename and info.filename.endswith(".py"):
                record = _sort_runs(record)
            target.writestr(zipfile.ZipInfo(info.filename, date_time=_EPOCH), record)
    return out.getvalue()


def _sort_runs(code: bytes) -> bytes:
    lines = code.split(b"\n")
    start = 0
    while start < len(lines):
        if not _CONSTANT.match(lines[start]):
            start += 1
            continue
        end = start
        while end < len(lines) and _CONSTANT.match(lines[end]):
            end += 1
        lines[start:end] = sorted(lines[start:end])
        start = end
    return b"\n".join(lines)
