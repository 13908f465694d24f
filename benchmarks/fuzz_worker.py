"""Fuzzing the worker: thousands of hostile messages on the work stream and in the tensor store.

    python benchmarks/fuzz_worker.py [--messages 5000] [--seed 0] [--workers 2] [--max-memory-mib 1024]

A private Valkey server and `--workers` worker processes (with a memory budget) get seeded-random hostile
input: raw stream messages (random bytes, missing fields, absurd ids and tokens, graphs that do not exist,
messages naming another graph's subgraphs), and graphs whose one subgraph is a mutated plan (random bytes,
truncated or bit-flipped protobuf, unknown op names, huge, negative or deep shapes, undefined inputs, wrong
dtypes, params of the wrong type or nested deep, uneven columns, garbage loops) or whose input tensor is
missing or corrupt. Then a valid graph must run and give the exact result. Prints a table: cases per kind,
and what became of them per dead-letter reason. Exits 1 if any case was not dead-lettered (or run, for a
mutation that left a valid plan), a worker died, or the valid graph failed.

`run_fuzz` is also what tests/worker/execute/test_fuzz.py runs, with a few hundred cases.
"""
import argparse
import json
import os
import random
import tempfile
import time
from collections import Counter

import torch

import ravop as R
from ravop.core.node import Node
from ravop.local.embedded import LocalServer, start_worker
from ravop.store import DEAD_LETTER, GraphKeys, Scripts, connect, graphs, queue, worker_info
from ravop.store.keys import worker_key
from ravop.wire import encode_tensor, pack_nodes, plan_pb2

TOKEN = "fuzz"
INPUT = 1   # the id of the subgraph's one stored input


# ----------------------------------------------------------------------------------- a valid subgraph

def base_rows():
    """neg, add, matmul, sum over a 4x4 float32 input: every mutation starts from this valid subgraph."""
    return [Node(2, "neg", [INPUT], shape=[4, 4], dtype=torch.float32, source="fuzz.py:1"),
            Node(3, "add", [2, INPUT], shape=[4, 4], dtype=torch.float32, source="fuzz.py:2"),
            Node(4, "matmul", [3, INPUT], shape=[4, 4], dtype=torch.float32, source="fuzz.py:3"),
            Node(5, "sum", [4], pkey=b'{"dim":null,"keepdim":false}', shape=[], dtype=torch.float32,
                    source="fuzz.py:4")]


def subgraph(rows, inputs=(INPUT,), outputs=(5,)):
    sub = plan_pb2.Subgraph(id=0, device="cpu", inputs=list(inputs), outputs=list(outputs))
    pack_nodes(rows, sub.nodes)
    return sub


def valid_bytes():
    return subgraph(base_rows()).SerializeToString()


def good_input():
    return encode_tensor(torch.arange(16, dtype=torch.float32).reshape(4, 4))


# ----------------------------------------------------------------------------------- hostile values

_OP_NAMES = ["os.system", "__import__", "eval", "const", "", "x" * 10_000, "neg\x00", "NEG", "matmul ", "loop",
             "tuple_get", "federated_mean"]
_SHAPES = [[-5], [10**12, 10**6], [2**62], [1] * 40, [4, -2], [0, 2**40], [2**31, 2**31]]
_DTYPES = ["float128", "", "bool", "int8", "complex128", "object", "float32\x00", "x" * 300]
_PARAMS = [b"[1, 2]", b'"dim"', b"null", b"42", b'{"dim": "x"}', b'{"dim": [1, [2, [3]]]}', b'{"keepdim": {}}',
           b'{"dim": 99}', b'{"shape": -1}', b'{"dim": 1e308}', b'{"\xff": 1}', b"{not json", b"\xff\xfe",
           b'{"dim": NaN}', b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"a": "' + b"y" * (17 << 20) + b'"}']


def _pack_mutated(rng, field, nodes):
    """The valid rows packed into `nodes` with `field` of one row made hostile, as a requester could write the
    wire columns (a dtype is a name there, params are bytes)."""
    rows = base_rows()
    k = rng.randrange(len(rows))
    row = rows[k]
    if field == "op":
        row.op = rng.choice(_OP_NAMES + ["".join(rng.choice("abcdefghij_.") for _ in range(rng.randint(1, 20)))])
    elif field == "shape":
        row.shape = tuple(rng.choice(_SHAPES))
    elif field == "params":
        row.pkey = rng.choice(_PARAMS)
    elif field == "inputs":
        row.inputs = rng.choice([[999], [row.id], [INPUT] * 7, [], [2**32 - 1], [5, 4]])
    pack_nodes(rows, nodes)
    if field == "dtype":
        nodes.dtype[k] = rng.choice(_DTYPES)


def _mutated(rng, field):
    sub = subgraph([])
    _pack_mutated(rng, field, sub.nodes)
    return sub.SerializeToString()


def _bit_flips(rng, data, flips):
    data = bytearray(data)
    for _ in range(flips):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def _garbage_loop(rng):
    sub = subgraph([Node(5, "loop", [INPUT], shape=[], dtype=torch.float32)])
    loop = sub.loop
    loop.rounds = rng.choice([0, 1, 10**9, 2**32 - 1])
    loop.n_carried = rng.choice([0, 1, 5, 2**32 - 1])
    loop.schedule.extend(rng.choice([[], [0, 10**9], [7, 1], [0]]))
    loop.n_steps = rng.choice([0, 10**12])
    loop.batch_size = rng.choice([0, 1, 2**63])
    loop.n_rows = rng.choice([0, 4, 2**63])
    loop.outer_ids.extend(rng.choice([[], [INPUT], [INPUT, 999]]))
    if rng.random() < 0.7:
        template = loop.templates.add()
        _pack_mutated(rng, rng.choice(["op", "shape", "inputs", "dtype"]), template.nodes)
        template.carry_holes.extend(rng.choice([[], [2], [INPUT, 9]]))
        template.carry_next.extend(rng.choice([[], [5], [3, 3, 3]]))
        template.rows = rng.choice([0, 2**40])
    return sub.SerializeToString()


def _corrupt_tensor(rng):
    data = good_input()
    return rng.choice([
        rng.randbytes(rng.randint(0, 64)),
        data[:rng.randint(0, len(data) - 1)],
        _bit_flips(rng, data[:6], 2) + data[6:],                               # magic, dtype code or rank
        data[:6] + (2**60).to_bytes(8, "little") + data[14:],                  # a huge first dimension
        b"RVC1" + data[4:6] + data[6:22] + (2**62).to_bytes(8, "little") + (1).to_bytes(4, "little"),
    ])


# ----------------------------------------------------------------------------------- hostile model archives

MODEL_OUT = 5


def _linear_archive(module=None):
    import io
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module if module is not None else torch.nn.Linear(2, 2)), buffer)
    return buffer.getvalue()


def _rezipped(data, rewrite_code=None, extra=(), compression=None, keep=lambda name: True):
    """`data` (a valid archive) with its top module's code rewritten, `extra` (name, bytes) entries added."""
    import io
    import zipfile
    import warnings
    warnings.filterwarnings("ignore", "Duplicate name", UserWarning)   # a duplicate entry is one of the cases
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if not keep(info.filename):
                continue
            text = src.read(info)
            if rewrite_code is not None and info.filename.endswith(".py") and "/code/__torch__/" in info.filename:
                text = rewrite_code(text)
            dst.writestr(info, text)
        for name, payload in extra:
            dst.writestr(name, payload, compress_type=compression or zipfile.ZIP_STORED)
    return out.getvalue()


def _nested(expr):
    return _rezipped(_linear_archive(), lambda t: t.replace(b"torch.linear(input", b"torch.linear(" + expr))


def _indented(columns):
    return _rezipped(_linear_archive(), lambda t: t.replace(b"\n    return", b"\n" + b" " * columns + b"return"))


def _size_lie():
    """A stored entry whose central directory declares another size than it holds."""
    data = bytearray(_linear_archive())
    at = data.rfind(b"PK\x01\x02")          # the last central directory record
    size = int.from_bytes(data[at + 24:at + 28], "little")
    data[at + 24:at + 28] = (size + 1_000_000).to_bytes(4, "little")
    return bytes(data)


def _unsafe_code():
    return _rezipped(_linear_archive(), lambda t: t.replace(b"return torch.linear(", b"torch.save(input, \"/tmp/x\")"
                                                            b"\n    return torch.linear("))


# Each a fixed archive (built once per process, so a worker checks each in its sandbox at most once): what each
# must come to is a dead letter with a reason, except the two valid ones, which run.
MODEL_VARIANTS = {
    "deep code": {
        "brackets 2,001 deep": lambda: _nested(b"(" * 2001 + b"input" + b")" * 2001),
        "brackets 100,000 deep (issue 44)": lambda: _nested(b"(" * 100_000 + b"input" + b")" * 100_000),
        "lists 50,000 deep": lambda: _nested(b"[" * 50_000 + b"input" + b"]" * 50_000),
        "unary minus 100,000 deep (crashes the sandbox)": lambda: _nested(b"- " * 100_000 + b"input"),
        "indented 3,000 columns": lambda: _indented(3000),
    },
    "zip bomb": {
        "code entry of 100 MiB": lambda: _rezipped(_linear_archive(), extra=[("archive/code/__torch__/bomb.py",
                                                                             b" " * (100 << 20))], compression=8),
        "tensor data 50 MiB from 50 KiB": lambda: _rezipped(_linear_archive(), extra=[("archive/data/9",
                                                                                     bytes(50 << 20))], compression=8),
        "70,000 entries": lambda: _rezipped(_linear_archive(), extra=[(f"archive/extra/{i}", b"")
                                                                      for i in range(70_000)]),
        "stored size lie": _size_lie,
    },
    "zip tricks": {
        "duplicate code entry": lambda: _rezipped(_linear_archive(), extra=[("archive/code/__torch__/torch/nn/"
                                                                             "modules/linear.py", b"x = 1\n")]),
        "path ..": lambda: _rezipped(_linear_archive(), extra=[("archive/../../etc/x.py", b"")]),
        "absolute path": lambda: _rezipped(_linear_archive(), extra=[("/etc/archive/code/x.py", b"")]),
        "backslash path": lambda: _rezipped(_linear_archive(), extra=[("archive\\code\\x.py", b"")]),
        "no code": lambda: _rezipped(_linear_archive(), keep=lambda name: "/code/" not in name),
        "truncated": lambda: _linear_archive()[:700],
        "random bytes": lambda: b"PK\x03\x04" + random.Random(1).randbytes(2000),
        "unsafe code (torch.save)": _unsafe_code,
    },
    "valid model": {
        "a Linear": _linear_archive,
        "brackets 1,000 deep": lambda: _nested(b"(" * 1000 + b"input" + b")" * 1000),
    },
}
_built = {}


def _model_case(rng, group):
    name = rng.choice(sorted(MODEL_VARIANTS[group]))
    if name not in _built:
        _built[name] = MODEL_VARIANTS[group][name]()
    data = _built[name]
    import hashlib
    from ravop.wire import encode_params
    params = {"model_hash": hashlib.sha256(data).hexdigest(), "param_slots": [], "buffer_slots": [], "n_args": 1,
              "kwarg_names": [], "training": False, "seed": 0}
    rows = [Node(2, "zeros", pkey=b'{"shape":[1,2]}', shape=[1, 2], dtype=torch.float32, source="fuzz.py:1"),
            Node(3, "torchscript_forward", [INPUT, 2], pkey=encode_params(params), source=f"fuzz.py:model {name}"),
            Node(MODEL_OUT, "tuple_get", [3], pkey=encode_params({"index": 0}), shape=[1, 2], dtype=torch.float32,
                 source="fuzz.py:2")]
    return {"plan": subgraph(rows).SerializeToString(),
            "input": encode_tensor(torch.frombuffer(bytearray(data), dtype=torch.uint8))}


MODEL_KINDS = {f"model: {group}": (lambda group: lambda rng: _model_case(rng, group))(group)
               for group in MODEL_VARIANTS}


# Each kind: rng -> {"plan": subgraph bytes, "input": stored input bytes or None} (a graph), or
# {"message": fields} (a raw stream message).
PLAN_KINDS = {
    "random plan bytes": lambda rng: {"plan": rng.randbytes(rng.randint(0, 300))},
    "truncated plan": lambda rng: {"plan": valid_bytes()[:rng.randint(1, len(valid_bytes()) - 1)]},
    "bit-flipped plan": lambda rng: {"plan": _bit_flips(rng, valid_bytes(), rng.randint(1, 8))},
    "unknown op": lambda rng: {"plan": _mutated(rng, "op")},
    "absurd shape": lambda rng: {"plan": _mutated(rng, "shape")},
    "wrong dtype": lambda rng: {"plan": _mutated(rng, "dtype")},
    "bad params": lambda rng: {"plan": _mutated(rng, "params")},
    "bad inputs": lambda rng: {"plan": _mutated(rng, "inputs")},
    "uneven columns": lambda rng: {"plan": _uneven(rng)},
    "garbage loop": lambda rng: {"plan": _garbage_loop(rng)},
    "missing input tensor": lambda rng: {"plan": valid_bytes(), "input": None},
    "corrupt input tensor": lambda rng: {"plan": valid_bytes(), "input": _corrupt_tensor(rng)},
    **MODEL_KINDS,
}

_NAMES = ["../../etc", "", "a" * 5000, "\x00", "тест", "*", DEAD_LETTER, "good-name"]


def _raw_fields(rng):
    return {rng.randbytes(rng.randint(0, 12)): rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(1, 5))}


MESSAGE_KINDS = {
    "random message": lambda rng: {"message": _raw_fields(rng)},
    "missing field": lambda rng: {"message": _without_one(rng, {"token": TOKEN, "graph": "g", "subgraph": "0"})},
    "bad subgraph id": lambda rng: {"message": {"token": TOKEN, "graph": "g", "subgraph": rng.choice(
        ["-1", "abc", "", "1e9", "9" * 40, "0x10", " 1", "\xff"])}},
    "bad token or graph": lambda rng: {"message": {"token": rng.choice(_NAMES), "graph": rng.choice(_NAMES),
                                                   "subgraph": "0"}},
    "no such graph": lambda rng: {"message": {"token": TOKEN, "graph": f"nosuch{rng.randrange(10**9)}",
                                              "subgraph": "0"}},
    "huge message": lambda rng: {"message": {"token": TOKEN, "graph": "g" * (1 << 20), "subgraph": "0"}},
    "forged: subgraph not in plan": lambda rng: {"forged": rng.choice([7, 99, 2**31])},
    "forged: subgraph not ready": lambda rng: {"forged": 1},
}


def _without_one(rng, fields):
    del fields[rng.choice(sorted(fields))]
    return fields


def _uneven(rng):
    sub = subgraph(base_rows())
    column = rng.choice([sub.nodes.id, sub.nodes.n_inputs, sub.nodes.rank, sub.nodes.shape, sub.nodes.inputs])
    if rng.random() < 0.5 and len(column):
        column.pop()
    else:
        column.append(rng.randrange(2**32))
    return sub.SerializeToString()


# ----------------------------------------------------------------------------------- running it

def _upload(client, graph_id, plan_bytes, input_bytes):
    """A one-subgraph graph whose plan and input are exactly the given bytes, started."""
    plan = plan_pb2.Plan(graph_id=graph_id)
    plan.subgraphs.add(id=0, device="cpu", inputs=[INPUT], outputs=[5])
    keys = graphs.upload(client, TOKEN, plan, {}, {"name": graph_id})
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.subgraphs, 0, plan_bytes)
    if input_bytes is not None:
        pipe.set(keys.tensor(INPUT), input_bytes)
    pipe.execute()
    Scripts(client).start(keys)
    return keys


def _decoy(client):
    """A running graph whose subgraph 1 waits forever for subgraph 0, which only a GPU worker would take:
    the target of forged messages."""
    plan = plan_pb2.Plan(graph_id="fuzz-decoy")
    first = plan.subgraphs.add(id=0, device="cuda", outputs=[2], successors=[1])
    pack_nodes([Node(2, "zeros", pkey=b'{"shape":[2]}', shape=[2], dtype=torch.float32)], first.nodes)
    second = plan.subgraphs.add(id=1, device="cpu", inputs=[2], outputs=[3], n_predecessors=1)
    pack_nodes([Node(3, "neg", [2], shape=[2], dtype=torch.float32)], second.nodes)
    keys = graphs.upload(client, TOKEN, plan, {}, {"name": "decoy"})
    Scripts(client).start(keys)
    return keys


RAW = "(all raw messages)"  # their dead letters name no case, so their outcomes are counted together


class Report:
    def __init__(self):
        self.cases = Counter()           # kind -> cases
        self.outcomes = Counter()        # (kind, reason or "ran") -> cases
        self.problems = []               # what went wrong: lost messages, hangs
        self.seconds = 0.0
        self.peak_rss = 0                # the largest resident size a worker advertised meanwhile (bytes)

    def table(self):
        lines = [f"{'kind':32} {'cases':>6}  outcome (dead-letter reason: cases)"]
        for kind, n in [*sorted(self.cases.items()), (RAW, sum(self.cases[k] for k in MESSAGE_KINDS))]:
            outcome = ", ".join(f"{reason}: {count}" for (k, reason), count in sorted(self.outcomes.items())
                                if k == kind)
            lines.append(f"{kind:32} {n:>6}  {outcome}")
        total = sum(self.cases.values())
        lines.append(f"{'all':32} {total:>6}  in {self.seconds:.1f} s ({total / max(self.seconds, 1e-9):.0f}/s); "
                     f"peak worker RSS {self.peak_rss / 2**20:.0f} MiB; problems: {len(self.problems)}")
        return "\n".join(lines + [f"  PROBLEM: {p}" for p in self.problems[:20]])


def run_fuzz(client, count, seed=0, stall_seconds=120.0, kinds=None):
    """Put `count` seeded-random hostile cases (of `kinds`, default all) before the workers serving `client`'s
    server and wait until each is dealt with. Returns a `Report`; `problems` is empty when every case was
    dead-lettered (or ran)."""
    rng = random.Random(seed)
    kinds = kinds or {**PLAN_KINDS, **MESSAGE_KINDS}
    names = sorted(kinds)
    decoy = _decoy(client)
    last = client.xrevrange(DEAD_LETTER, count=1)
    after = "(" + last[0][0].decode() if last else "-"   # what follows is this run's
    report = Report()
    began = time.monotonic()
    expected_raw = 0
    graph_kinds = {}
    for index in range(count):
        kind = rng.choice(names)
        case = kinds[kind](rng)
        report.cases[kind] += 1
        if "plan" in case:
            graph_id = f"fz{seed}-{index}"
            _upload(client, graph_id, case["plan"], case.get("input", good_input()))
            graph_kinds[graph_id] = kind
        elif "forged" in case:
            client.xadd(queue("cpu"), {"token": TOKEN, "graph": decoy.graph_id, "subgraph": str(case["forged"])})
            expected_raw += 1
        else:
            client.xadd(queue("cpu"), case["message"])
            expected_raw += 1
    _wait_for_drain(client, report, stall_seconds)
    report.seconds = time.monotonic() - began
    dead = [fields for _, fields in client.xrange(DEAD_LETTER, min=after)]
    by_graph = {}
    raw = Counter()
    for fields in dead:
        graph_id = fields.get(b"graph", b"").decode(errors="replace")
        reason = fields.get(b"reason", b"").decode()
        if not reason:
            report.problems.append(f"a dead letter without a reason: {fields}")
        if graph_id in graph_kinds:
            by_graph.setdefault(graph_id, []).append(reason)
        else:
            raw[reason] += 1
    for graph_id, kind in graph_kinds.items():
        state = client.hget(GraphKeys(TOKEN, graph_id).meta, "state")
        reasons = by_graph.get(graph_id, [])
        if state == b"done" and not reasons:
            report.outcomes[(kind, "ran (the mutation left a valid plan)")] += 1
        elif state == b"failed" and len(reasons) == 1:
            report.outcomes[(kind, reasons[0])] += 1
        else:
            report.problems.append(f"{kind} {graph_id}: state {state}, dead letters {reasons}")
    for reason, n in raw.items():
        report.outcomes[(RAW, reason)] += n
    if sum(raw.values()) != expected_raw:
        report.problems.append(f"{expected_raw} raw messages, {sum(raw.values())} dead letters")
    if client.hget(decoy.meta, "state") != b"running":
        report.problems.append("forged messages changed the graph they named")
    return report


def _wait_for_drain(client, report, stall_seconds):
    """Until the stream is empty and nothing is pending; a problem if it stops shrinking for `stall_seconds`."""
    stream = queue("cpu")
    last, since = None, time.monotonic()
    while True:
        report.peak_rss = max([report.peak_rss] + [w.get("rss", 0) for w in worker_info.read_all(client)])
        left = client.xlen(stream) + client.xpending(stream, "workers")["pending"]
        if left == 0:
            return
        if left != last:
            last, since = left, time.monotonic()
        elif time.monotonic() - since > stall_seconds:
            report.problems.append(f"stalled: {left} messages left for {stall_seconds:.0f} s")
            return
        time.sleep(0.05)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=5000, help="hostile cases (at most 9,000: the dead-letter "
                                                                   "stream keeps about 10,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-memory-mib", type=int, default=1024, help="each worker's memory budget")
    args = parser.parse_args(argv)
    server = LocalServer()
    client = connect(server.url)
    logs = tempfile.mkdtemp(prefix="fuzz-")
    procs = {}
    try:
        for i in range(args.workers):
            name = f"fuzz-{i}"
            procs[name] = start_worker(server.url, name, "cpu", threads=1, log_path=os.path.join(logs, name + ".log"),
                                       extra_args=["--max-memory-bytes", str(args.max_memory_mib << 20)])
        for name in procs:
            while not client.exists(worker_key(name)):
                time.sleep(0.05)
        report = run_fuzz(client, min(args.messages, 9000), args.seed)
        dead_workers = [name for name, proc in procs.items() if proc.poll() is not None]
        if dead_workers:
            report.problems.append(f"workers died: {dead_workers} (logs in {logs})")
        R.initialize(token="after-fuzz", redis_url=server.url)
        R.Graph(name="after")
        x = R.t(torch.ones(100, 100))
        (x @ x).persist_op("good")
        R.activate()
        R.execute(timeout=120)
        if not torch.equal(R.fetch_persisting_op("good"), torch.full((100, 100), 100.0)):
            report.problems.append("the valid graph after the fuzz gave a wrong result")
        print(report.table())
        print(json.dumps({"cases": sum(report.cases.values()), "problems": len(report.problems),
                          "seconds": round(report.seconds, 1), "peak_worker_rss_mib": report.peak_rss >> 20}))
        return 1 if report.problems else 0
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
