"""The embedded server's heap (ravop/local/embedded.py, SERVER_HEAP_TUNABLES): values replaced again and again, as a
loop replaces its checkpoint, keep the server at about one set of them. With glibc's default thresholds the
deleted values' memory stayed in its heap and the server held two sets after three replacements (issue 46)."""
import os
import sys

import pytest
import redis

from ravop.local.embedded import LocalServer

MIB = 1 << 20
# the sizes of a model checkpoint's values: whole 4 MiB chunks, smaller tensors, a few small ones
SIZES = [4 * MIB] * 24 + [2_359_296] * 12 + [589_824] * 24 + [147_456] * 24 + [4_096] * 24


def _rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and tunes glibc's heap: Linux only")
def test_a_server_replacing_its_values_keeps_one_set_of_them():
    server = LocalServer()
    try:
        client = redis.Redis.from_url(server.url)
        logical = sum(SIZES) / MIB
        blob = os.urandom(max(SIZES))
        held = []
        for generation in range(5):   # each set written, then the one before deleted: a checkpoint replaced
            for k, size in enumerate(SIZES):
                client.set(f"g{generation}:{k}", blob[:size])
            if generation:
                client.delete(*(f"g{generation - 1}:{k}" for k in range(len(SIZES))))
            held.append(_rss_mib(server.process.pid))
        assert max(held[1:]) < logical * 1.3 + 16, (logical, held)   # glibc's default: ~2x from the third on
    finally:
        server.stop()
