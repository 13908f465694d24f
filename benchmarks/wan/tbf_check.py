"""Cross-check of the shaping proxy's rate against the kernel's `tbf` qdisc (root only): the same bulk TCP
transfer once through a veth pair into a network namespace, shaped by `tbf` at `rate`, and once through a
`benchmarks.wan.link` proxy at `rate` on loopback; both achieved rates are reported beside the configured one.

    python -m benchmarks.wan.tbf_check [--mbit 100] [--mbytes 20]
"""
import argparse
import json
import os
import socket
import subprocess
import sys

from .lab import Lab, free_port

# Receives until the sender closes; prints bytes and seconds from the first byte to the last.
_RECEIVER = """import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print('ready', flush=True)
c, _ = s.accept(); n = 0; first = None
while True:
    d = c.recv(1 << 20)
    if not d: break
    if first is None: first = time.perf_counter()
    n += len(d)
print(n, time.perf_counter() - first, flush=True)
"""


def _send(host, port, n_bytes):
    block = b"\0" * (1 << 20)
    with socket.create_connection((host, port), timeout=60) as s:
        left = n_bytes
        while left > 0:
            s.sendall(block[:min(left, len(block))])
            left -= len(block)


def _transfer(receiver_prefix, listen_host, send_host, send_port, listen_port, n_bytes):
    """(bits/s achieved) of one transfer to a receiver started with `receiver_prefix` (e.g. ip netns exec)."""
    receiver = subprocess.Popen([*receiver_prefix, sys.executable, "-c", _RECEIVER, listen_host, str(listen_port)],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        _send(send_host, send_port, n_bytes)
        got, seconds = receiver.stdout.readline().split()
        return int(got) * 8 / float(seconds)
    finally:
        receiver.kill()
        receiver.wait()


def tbf_rate(lab, rate_bps, n_bytes):
    """Achieved bits/s of a transfer into a namespace through a veth shaped by tbf at `rate_bps`."""
    ns = lab.add_namespace("tbf")
    near, far = f"wl{os.getpid()}a", f"wl{os.getpid()}b"
    subnet = 10 + os.getpid() % 200
    commands = [["ip", "link", "add", near, "type", "veth", "peer", "name", far],
                ["ip", "link", "set", far, "netns", ns],
                ["ip", "addr", "add", f"10.{subnet}.77.1/30", "dev", near],
                ["ip", "link", "set", near, "up"],
                ["ip", "netns", "exec", ns, "ip", "addr", "add", f"10.{subnet}.77.2/30", "dev", far],
                ["ip", "netns", "exec", ns, "ip", "link", "set", far, "up"],
                ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
                ["tc", "qdisc", "add", "dev", near, "root", "tbf", "rate", f"{int(rate_bps)}bit", "burst", "64kb",
                 "latency", "100ms"]]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True)
        return _transfer(["ip", "netns", "exec", ns], f"10.{subnet}.77.2", f"10.{subnet}.77.2", 5201, 5201, n_bytes)
    finally:
        subprocess.run(["ip", "link", "del", near], capture_output=True)   # takes its peer with it


def proxy_rate(lab, rate_bps, n_bytes):
    """(achieved bits/s, the link process's CPU seconds) of a transfer through a shaping proxy at `rate_bps`
    (to a receiver on loopback: the proxy's upstream)."""
    target = free_port()
    lab.port = target
    ports = lab.start_links({"check": {"up": {"rate_bps": rate_bps, "delay_s": 0.0}, "down": {"delay_s": 0.0}}})
    cpu_before = lab.link_stats()["cpu_s"]
    rate = _transfer([], "127.0.0.1", "127.0.0.1", ports["check"], target, n_bytes)
    return rate, lab.link_stats(fresh=True)["cpu_s"] - cpu_before


def check(mbit=100.0, mbytes=20.0):
    rate, n = mbit * 1e6, int(mbytes * 1e6)
    with Lab() as lab:
        kernel = tbf_rate(lab, rate, n)
        proxy, cpu = proxy_rate(lab, rate, n)
    return {"configured_bps": rate, "tbf_bps": kernel, "proxy_bps": proxy, "bytes": n, "proxy_cpu_s": cpu,
            "proxy_cpu_per_mbyte_ms": cpu / mbytes * 1e3}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbit", type=float, default=100.0)
    parser.add_argument("--mbytes", type=float, default=20.0)
    args = parser.parse_args()
    result = check(args.mbit, args.mbytes)
    print(json.dumps(result, indent=1))
    print(f"configured {result['configured_bps'] / 1e6:.1f} Mbit/s: tbf {result['tbf_bps'] / 1e6:.2f}, proxy "
          f"{result['proxy_bps'] / 1e6:.2f}; proxy CPU {result['proxy_cpu_s']:.2f} s for {args.mbytes:g} MB")


if __name__ == "__main__":
    main()
