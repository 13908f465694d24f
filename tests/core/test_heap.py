"""`ravop.core.heap.trim` gives freed heap pages back to the operating system: blocks freed below glibc's mmap
threshold stay in the process (here 48 MiB of 64 KiB blocks, a live block after them) until it is called."""
import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import ctypes, os
    from ravop.core import heap
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    blocks = [ctypes.create_string_buffer(64 << 10) for _ in range(768)]
    kept = ctypes.create_string_buffer(64 << 10)   # live after them: free() alone cannot shrink the heap's top
    held = rss()
    del blocks
    freed = rss()
    print(heap.trim(), held, freed, rss())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc")
def test_trim_gives_freed_heap_back():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    trimmed, held, freed, after = done.stdout.split()
    assert trimmed == "True"
    assert int(freed) - int(after) > 32 << 20, (held, freed, after)   # most of the 48 MiB went back
