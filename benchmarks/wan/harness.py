"""One WAN-lab run: the store, N providers each behind its own emulated link, and the requester (direct, on the
store's unix socket) training an MLP with one of R.parallel's strategies; then the figures the field reports.

Unequal providers (`speeds`, with `emulate`): provider k acts as a device of `device_flops * speeds[k]` FLOP/s, and
the run reports the fleet's compute used, FLOPs computed / (wall x the fleet's FLOP/s), beside each provider's.

Time dilation (`dilation` D > 1, with `emulate`): each provider acts as a device of `device_flops` / D FLOP/s
(worker/execute/emulated_device.py) and every link runs at its rates / D with its delays x D, so the whole run is the
real one slowed D times; the harness divides every measured time by D (bytes are unchanged). This lets 8
providers share 2 cores: the emulated compute time must exceed what the shared cores really take.
"""
import contextlib
import inspect
import io
import json
import math
import os
import signal
import threading
import time
import uuid
from typing import Collection, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as TF
from torch import nn

from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.client.placement import contributions, held_by
from ravop.core.graph_states import DONE, FAILED
from ravop.store import GraphKeys, workers
from ravop.store.graphs import list_graphs
from worker.loops.loop_subgraph import CHECKPOINT_SECONDS, RESIDENT_CHECKPOINT_SECONDS

from .lab import Lab, remove_stale

# Strategies the harness builds by name (getattr on R.parallel, never eval); DiLoCo comes with its own issue.
STRATEGIES = ("DataParallel", "LocalSGD", "Gossip", "Pipeline", "DiLoCo")
SEED = 0
RECLAIM_IDLE = 5.0   # seconds (undilated) a message nobody works on waits before another provider takes it


def build_strategy(name, args, providers):
    """R.parallel.<name>(**args), with `replicas` (or a pipeline's `stages`) = providers unless given."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}: one of {', '.join(STRATEGIES)}")
    cls = getattr(R.parallel, name, None)
    if cls is None:
        raise ValueError(f"R.parallel has no {name} in this checkout (it comes with its own issue)")
    args = dict(args)
    if isinstance(args.get("round"), list):   # JSON has no Shares: round=[1, 1, 0.5, 0.25] stands for it
        args["round"] = R.parallel.Shares(*args["round"])
    accepted = inspect.signature(cls).parameters
    size = "stages" if "stages" in accepted else "replicas"
    args.setdefault(size, providers)
    unknown = set(args) - set(accepted)
    if unknown:
        raise ValueError(f"{name} takes no {', '.join(sorted(unknown))} (it takes {', '.join(accepted)})")
    missing = [p.name for p in accepted.values() if p.default is inspect.Parameter.empty and p.name not in args]
    if missing:
        raise ValueError(f"{name} needs {', '.join(missing)}: give --strategy-arg {missing[0]}=VALUE")
    return cls(**args)


def parse_strategy_args(pairs):
    """{key: value} of `key=value` strings; values are JSON (16, 0.5, true, "text") or else plain strings."""
    parsed = {}
    for pair in pairs or ():
        key, sep, text = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--strategy-arg takes key=value, not {pair!r}")
        try:
            parsed[key] = json.loads(text)
        except ValueError:
            parsed[key] = text
    return parsed


# ------------------------------------------------------------------------------ the task: an MLP on MNIST-shaped data

def task_data(rows, test_rows=2048, features=784):
    """Synthetic MNIST-shaped data (as benchmarks/bench_ravdl.py's): features in [0, 1], labels a linear rule
    can learn; `rows` training rows and `test_rows` held out."""
    rng = np.random.default_rng(1)
    X = rng.random((rows + test_rows, features), dtype=np.float32)
    y = (X[:, :10] * np.arange(1, 11, dtype=np.float32)).argmax(1).astype(np.int64)
    return X[:rows], y[:rows], X[rows:], y[rows:]


def torch_mlp(hidden):
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def ravdl_mlp(net):
    model = NeuralNetwork(optimizer=Adam(lr=0.001), loss="CrossEntropy")
    first, second = net[0], net[2]
    model.add(Dense(first.out_features, input_shape=(784,), initial_W=first.weight.detach().numpy(),
                    initial_w0=first.bias.detach().numpy()))
    model.add(Activation("relu"))
    model.add(Dense(second.out_features, initial_W=second.weight.detach().numpy(),
                    initial_w0=second.bias.detach().numpy()))
    return model


def accuracy(net, X, y):
    with torch.no_grad():
        return float((net(torch.from_numpy(X)).argmax(1) == torch.from_numpy(y)).float().mean())


def one_worker_baseline(X, y, X_test, y_test, hidden, batch, epochs):
    """Final loss (mean of the last epoch's batches) and test accuracy of plain one-process training on the same
    samples, in order."""
    net = torch_mlp(hidden)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.001)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    losses = []
    for _ in range(epochs):
        losses = []
        for start in range(0, len(X), batch):
            loss = TF.cross_entropy(net(Xt[start:start + batch]), yt[start:start + batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return {"final_loss": float(np.mean(losses)), "test_accuracy": accuracy(net, X_test, y_test)}


def synchronisations(strategy, rows, batch, epochs):
    """How many times the replicas exchange state: LocalSGD-like strategies at each segment's end
    (`segments`), the others every step."""
    replicated = hasattr(strategy, "replicas") and not hasattr(strategy, "stages") and \
        type(strategy).__name__ != "DataParallel"
    steps = math.ceil((strategy.shard_rows(rows, batch)[0] if replicated else rows) / batch) * epochs
    segments = getattr(strategy, "segments", None)
    return len(segments(steps, 0)) if segments is not None else steps


# ------------------------------------------------------------------------------ churn

class Churn(threading.Thread):
    """Every `every` s SIGKILL the next provider (round robin), and start it again (same name, same link)
    `restart_after` s later; records (killed at, restarted at) per kill, in seconds since `start`."""

    def __init__(self, lab, names, start_worker, every, restart_after, start):
        super().__init__(daemon=True)
        self.lab, self.names, self.start_worker = lab, names, start_worker
        self.every, self.restart_after, self.start_time = every, restart_after, start
        self.events = []
        self.down = set()   # providers killed and not started again yet: the lab's liveness check excuses them
        self.stopped = threading.Event()

    def run(self):
        k = 0
        while True:
            k += 1   # the k-th kill at k * every s from the start, whatever the restarts took
            if self.stopped.wait(max(0.0, self.start_time + k * self.every - time.monotonic())):
                return
            name = self.names[(k - 1) % len(self.names)]
            process = self.lab.workers[name]
            killed = time.monotonic() - self.start_time
            self.down.add(name)
            process.send_signal(signal.SIGKILL)
            process.wait()
            if self.stopped.wait(self.restart_after):
                self.events.append({"provider": name, "killed_s": killed, "restarted_s": None})
                return
            self.start_worker(name)
            self.down.discard(name)
            self.events.append({"provider": name, "killed_s": killed,
                                "restarted_s": time.monotonic() - self.start_time})

    def stop(self):
        self.stopped.set()
        self.join()


# ------------------------------------------------------------------------------ one run

def run(strategy_name, strategy_args=None, providers=2, profile=None, emulate=False, device_flops=None,
        dilation=1.0, rows=4096, batch=128, epochs=1, hidden=256, churn_every=None, churn_restart=10.0,
        checkpoint_seconds=CHECKPOINT_SECONDS, checkpoint_steps=None,
        resident_checkpoint_seconds=RESIDENT_CHECKPOINT_SECONDS, timeout=1800, progress=print, speeds=None,
        report_every=None):
    """The figures of one run (a dict, see report.py). `profile`: a benchmarks.wan.profiles.Profile (None: no
    shaping, the proxies only count); `emulate`: providers act as devices of `device_flops` FLOP/s (required
    then), in a run dilated `dilation` times; churn: kill a provider every `churn_every` s of (undilated) time;
    the providers' loops checkpoint every `checkpoint_seconds` (undilated) or `checkpoint_steps` steps (0: never by
    steps; None: the workers' default), resident replicas at a synchronisation every `resident_checkpoint_seconds`
    (or `checkpoint_steps` when given), the workers' defaults unless given; `speeds`: each provider's device as a
    multiple of `device_flops` (None: all alike); `report_every`: print the engine's records of each loop (steps,
    holders, takeovers, checkpoint) every this many s while waiting."""
    if emulate and not device_flops:
        raise ValueError("emulated providers need device_flops (the FLOP/s of the device they stand for)")
    speeds = check_speeds(speeds, providers, emulate)
    if not emulate and dilation != 1.0:
        raise ValueError("time dilation needs emulated compute (real compute cannot be slowed down)")
    strategy = build_strategy(strategy_name, strategy_args or {}, providers)
    X, y, X_test, y_test = task_data(rows)
    remove_stale()
    with Lab() as lab:
        lab.start_store()
        names = [f"provider-{k}" for k in range(providers)]
        flops_of = {name: (device_flops or 0.0) * speed for name, speed in zip(names, speeds)}
        link = (profile.dilated(dilation).link_config(rto_min_s=0.2 * dilation) if profile is not None
                else {"up": {"rate_bps": None, "delay_s": 0.0}, "down": {"rate_bps": None, "delay_s": 0.0}})
        ports = lab.start_links({name: link for name in names})

        def start_provider(name):
            extra = ["--benchmark-busy-file", lab.busy_file(name)]
            if emulate:
                extra += ["--emulate-device-flops", repr(flops_of[name] / dilation)]
            # the loops' checkpoint clock is dilated like every other time, and so are the workers' liveness
            # (a heartbeat queued behind a checkpoint on a link 10x slower would miss an undilated TTL: the others
            # would take its replica over) and the reclaim timeout
            extra += ["--checkpoint-seconds", repr(checkpoint_seconds * dilation),
                      "--resident-checkpoint-seconds", repr(resident_checkpoint_seconds * dilation),
                      *(["--checkpoint-steps", str(checkpoint_steps)] if checkpoint_steps is not None else []),
                      "--dead-after", repr(workers.TTL * dilation), "--reclaim-idle", repr(RECLAIM_IDLE * dilation)]
            lab.start_worker(name, ports[name], extra)
        for name in names:
            start_provider(name)
        lab.wait_registered(names)
        compute = f"emulated at {device_flops:.3g} FLOP/s, dilation {dilation:g}" if emulate else "real compute"
        if len(set(speeds)) > 1:
            compute += f", speeds {', '.join(f'{s:g}' for s in speeds)}"
        progress(f"{providers} providers up ({strategy!r}, {profile.describe() if profile else 'unshaped'}, "
                 f"{compute})")

        token = f"wan-{uuid.uuid4().hex[:6]}"
        R.initialize(token=token, redis_url=f"unix://{lab.socket}")
        R.Graph(name=f"wan {strategy!r}", seed=SEED)
        model = ravdl_mlp(torch_mlp(hidden))
        with contextlib.redirect_stdout(io.StringIO()):
            loss_names = model.fit(X, y, n_epochs=epochs, batch_size=batch, strategy=strategy)
        model.persist_weights()
        summary = R.activate()

        lab.wait_ready(providers)   # the run starts once every provider waits for work, not while one connects
        if len(set(speeds)) > 1:     # provider k must run replica k, whose share is k's speed
            hold_back(lab, names)
        links_before, store_before = lab.link_stats(fresh=True), lab.store_link_bytes()
        busy_before = {name: lab.busy(name) or {"busy_s": 0.0, "real_s": 0.0, "flops": 0.0} for name in names}
        start, started_at = time.monotonic(), time.time()
        churn = None
        if churn_every:
            churn = Churn(lab, names, start_provider, churn_every * dilation, churn_restart * dilation, start)
            churn.start()
        progress_seen = []
        down = churn.down if churn is not None else set()   # killed by the churn: not a failure of the lab
        try:
            R.execute()
            if len(set(speeds)) > 1:
                release_in_order(lab, names, repr(strategy), down)
            watch_progress(lab, token, start, timeout * dilation, progress_seen, down,
                           report_every=report_every * dilation if report_every else None,
                           report=lambda keys, t: progress(f"{t / dilation:.0f} s: {engine_records(lab.client, keys)}"))
        finally:
            if churn is not None:
                churn.stop()
        wall, ended_at = time.monotonic() - start, time.time()
        links_after, store_after = lab.link_stats(fresh=True), lab.store_link_bytes()
        busy_after = {name: lab.busy(name) or busy_before[name] for name in names}
        started_pids = [process.pid for process in lab.processes]   # for checking that none outlives the lab
        losses = R.fetch_losses()
        held = held_roles(repr(strategy))
        contributed = contributions().get(repr(strategy), {})   # who ran each replica over time, and its steps
        weights = {name: R.fetch_persisting_op(name) for name in
                   ("Dense_1.weight", "Dense_1.bias", "Dense_2.weight", "Dense_2.bias")}
    trained = torch_mlp(hidden)
    with torch.no_grad():
        for param, key in zip(trained.parameters(), weights):
            param.copy_(torch.as_tensor(np.asarray(weights[key])))
    syncs = synchronisations(strategy, rows, batch, epochs)
    per_provider = []
    for k, name in enumerate(names):
        up = links_after["links"][name]["up"]["bytes"] - links_before["links"][name]["up"]["bytes"]
        down = links_after["links"][name]["down"]["bytes"] - links_before["links"][name]["down"]["bytes"]
        busy = busy_after[name]["busy_s"] - busy_before[name]["busy_s"]
        real = busy_after[name]["real_s"] - busy_before[name]["real_s"]
        per_provider.append({"provider": name, "compute_s": busy / dilation, "real_compute_s": real,
                             "network_wait_s": (wall - busy) / dilation, "utilization": busy / wall,
                             "bytes_up": up, "bytes_down": down, "bytes_up_per_sync": up / syncs,
                             "bytes_down_per_sync": down / syncs,
                             "retransmits": links_after["links"][name]["up"]["retransmits"] +
                             links_after["links"][name]["down"]["retransmits"],
                             "flops": busy_after[name]["flops"] - busy_before[name]["flops"],
                             "speed": speeds[k], "device_flops": flops_of[name] if emulate else None,
                             "roles": held.get(name, []),
                             **time_profile(busy_before[name], busy_after[name], started_at, ended_at, dilation)})
    last_epoch = losses.batch[losses.epoch == losses.epoch.max()] if len(losses.batch) else losses.batch
    samples = rows * epochs
    result = {
        "strategy": repr(strategy), "strategy_name": strategy_name, "providers": providers,
        "profile": profile.describe() if profile else "unshaped", "profile_name": profile.name if profile else None,
        "compute": "emulated" if emulate else "real", "device_flops": device_flops, "dilation": dilation,
        "checkpoint_seconds": checkpoint_seconds, "checkpoint_steps": checkpoint_steps,
        "resident_checkpoint_seconds": resident_checkpoint_seconds,
        "rows": rows, "batch": batch, "epochs": epochs, "hidden": hidden, "synchronisations": syncs,
        "subgraphs": summary.get("subgraphs"),
        "wall_s": wall / dilation, "samples_per_s": samples / (wall / dilation),
        "compute_s": sum(p["compute_s"] for p in per_provider) / providers,
        "network_wait_s": sum(p["network_wait_s"] for p in per_provider) / providers,
        "utilization": sum(p["utilization"] for p in per_provider) / providers,
        "speeds": speeds,
        # FLOPs computed / (wall x the fleet's FLOP/s), all undilated: the share of what the fleet could compute
        "fleet_utilization": sum(p["flops"] for p in per_provider) / (wall / dilation * sum(flops_of.values()))
        if emulate else None,
        "bytes_up": sum(p["bytes_up"] for p in per_provider), "bytes_down": sum(p["bytes_down"] for p in per_provider),
        "bytes_per_sync": sum(p["bytes_up"] + p["bytes_down"] for p in per_provider) / syncs,
        "link_cpu_s": links_after["cpu_s"] - links_before["cpu_s"],
        "store_bytes_in": store_after[0] - store_before[0], "store_bytes_out": store_after[1] - store_before[1],
        "final_loss": float(np.nanmean(last_epoch)) if len(last_epoch) else None,
        "test_accuracy": accuracy(trained, X_test, y_test),
        "one_worker": one_worker_baseline(X, y, X_test, y_test, hidden, batch, epochs),
        "loss_names": len(loss_names), "providers_detail": per_provider, "contributions": contributed,
        "churn": None if churn is None else {"every_s": churn_every, "restart_after_s": churn_restart,
                                             "events": [{k: (v / dilation if isinstance(v, float) else v)
                                                         for k, v in e.items()} for e in churn.events],
                                             "progress_over_time": [(t / dilation, n) for t, n in progress_seen]},
        "machine_load": os.getloadavg(), "pids": started_pids,
    }
    result["link_cpu_share"] = result["link_cpu_s"] / (wall)
    return result


def check_speeds(speeds: Optional[Sequence[float]], providers: int, emulate: bool) -> list[float]:
    """Each provider's speed (a multiple of device_flops): `speeds`, checked, or all 1."""
    if speeds is None:
        return [1.0] * providers
    if not emulate:
        raise ValueError("provider speeds need emulated compute (--emulate --device-flops F)")
    speeds = [float(s) for s in speeds]
    if len(speeds) != providers or not all(s > 0 for s in speeds):
        raise ValueError(f"give one speed > 0 per provider ({providers}), not {speeds}")
    return speeds


def hold_back(lab: Lab, names: Sequence[str]) -> None:
    """Stop the providers (SIGSTOP) until their pending reads of the work stream have timed out, so that none
    takes work before `release_in_order` lets it: which provider takes which replica is otherwise the stream's
    choice, and a replica's share must meet its provider's speed."""
    for name in names:
        os.kill(lab.workers[name].pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while any(c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "") for c in lab.client.client_list()):
        if time.monotonic() > deadline:
            raise RuntimeError("stopped providers still wait on the work stream after 10 s")
        time.sleep(0.05)


def release_in_order(lab: Lab, names: Sequence[str], strategy: str, down: Collection[str],
                     timeout: float = 60) -> None:
    """Continue the providers held back one by one, each once the one before holds its replica: the stream hands
    the replicas' loops out in replica order, so provider k takes replica k (checked)."""
    for k, name in enumerate(names):
        os.kill(lab.workers[name].pid, signal.SIGCONT)
        deadline = time.monotonic() + timeout
        while not held_roles(strategy).get(name):
            lab.check_alive(down)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} took no replica within {timeout} s")
            time.sleep(0.05)
        roles = held_roles(strategy)[name]
        if roles != [f"replica {k}"]:
            raise RuntimeError(f"{name} took {roles}, not replica {k}: its speed would not meet its share")


def held_roles(strategy: str) -> dict[str, list[str]]:
    """{provider: [the roles it ran ('replica r')]} of the current graph's fit under `strategy` (its repr)."""
    roles = {}
    for role, workers_ in held_by().get(strategy, {}).items():
        for worker in workers_:
            roles.setdefault(worker, []).append(role)
    return roles


def time_profile(before, after, started_at, ended_at, dilation):
    """Where a provider's wall time went besides computing (undilated seconds): until its first unit of work
    (fetching the plan, its inputs, the data shard), in its loop steps' exchange (resident replicas: sends and
    waits for the others' values) and writes (flushed losses, checkpoints), and after its last unit (the
    outputs' writes, the graph's end). The rest of the wall time is queue hops and reads between units, and the
    emulation's own lag (`overslept_s`: late wake-ups and the busy file's writes, of which `absorbed_s` was made
    up from later steps' slack; worker/execute/emulated_device.py)."""
    first, last = after.get("first"), after.get("last")
    if first is None or last is None:
        return {}
    return {"before_first_s": max(0.0, first - started_at) / dilation,
            "after_last_s": max(0.0, ended_at - last) / dilation,
            "exchange_s": (after.get("exchange_s", 0.0) - before.get("exchange_s", 0.0)) / dilation,
            **{k: (after.get(k, 0.0) - before.get(k, 0.0)) / dilation
               for k in ("writes_s", "overslept_s", "absorbed_s")}}


def engine_records(client, keys: GraphKeys) -> str:
    """Per loop subgraph of the current graph: its steps done, the workers that held it (`held`) and what its
    takeovers found (`attempts`: "message deliveries resumed-from failures"), and its checkpoint's step: where a
    churned run's time goes, as the engine recorded it."""
    pipe = client.pipeline(transaction=False)
    for name in (keys.steps, keys.held, keys.attempts):
        pipe.hgetall(name)
    steps, held, attempts = pipe.execute()
    loops = sorted(int(k) for k in held)
    checkpoints = [client.hget(keys.checkpoint(k), "step") for k in loops]
    parts = []
    for subgraph, checkpoint in zip(loops, checkpoints):
        record = attempts.get(str(subgraph).encode(), b"").decode().split(" ")
        parts.append(f"loop {subgraph}: step {int(steps.get(str(subgraph).encode(), 0))}, checkpoint "
                     f"{checkpoint.decode() if checkpoint else '-'}, held by {held[str(subgraph).encode()].decode()}"
                     + (f", {record[1]} deliveries, last from {record[2]}" if len(record) == 4 else ""))
    return "; ".join(parts)


def watch_progress(lab, token, start, timeout, seen, down=(), report_every=None, report=None):
    """Wait until the graph is done, noting (seconds since start, loop steps done) every 0.25 s: how fast useful
    work lands (the churn report's recovery times come from it). Fails at once when a process of the lab dies
    (but the providers in `down`: those the churn has killed and not restarted yet). Every `report_every` s
    `report(the graph's keys, seconds since start)`."""
    deadline = time.monotonic() + timeout
    next_report = start + report_every if report_every else math.inf
    while True:
        lab.check_alive(down)
        graph = list_graphs(lab.client, token)[-1]
        seen.append((time.monotonic() - start, graph["progress"]))
        if time.monotonic() > next_report:
            report(GraphKeys(token, graph["id"]), time.monotonic() - start)
            next_report += report_every
        if graph["state"] == DONE:
            return
        if graph["state"] == FAILED:
            raise RuntimeError(f"the graph failed: {graph}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the graph did not finish within {timeout:.0f} s: {graph}")
        time.sleep(0.25)
