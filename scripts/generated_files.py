"""What the scripts that generate a checked-in file share: write it, or with --check say that it is stale."""
import sys


def write_or_check(path, text, check, remedy):
    """Write `text` to `path`; with `check`, write nothing and return 1 (after printing `remedy`) if the file
    differs from `text`. Returns the exit status."""
    if check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is out of date: run {remedy}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    return 0
