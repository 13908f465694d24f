"""The WAN lab (benchmarks/wan): the link model's arithmetic, the proxy against the kernel's tbf in a network
namespace, and a real run (a server, 2 `ravop-worker` providers each behind a shaped link, LocalSGD) whose byte
counts agree with what the store counted on the same connections, leaving no process, namespace or temp dir."""
import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.wan import __main__, harness, link, profiles, report, tbf_check  # noqa: E402
from benchmarks.wan.lab import PREFIX, Lab, namespaces  # noqa: E402
from worker.execute import emulated_device  # noqa: E402


def alive(pids):
    """Those of `pids` still running (not zombies)."""
    running = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.append(pid)
        except OSError:
            pass
    return running


def leftovers():
    """Processes, namespaces and temp dirs of this process's WAN labs that still exist (the store renames its
    process, so the runs' own pids are checked too: `alive`)."""
    mark = f"{PREFIX}-{os.getpid()}-"
    processes = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                if mark.encode() in f.read():
                    processes.append(path)
        except OSError:
            pass
    return processes, [n for n in namespaces() if n.startswith(mark)], glob.glob(f"/tmp/{mark}*")


def test_a_direction_serialises_delays_and_keeps_order():
    d = link.Direction(rate_bps=8e6, delay_s=0.05)          # 1 MB/s
    assert d.arrival(1_000_000, now=0.0) == pytest.approx(1.0 - 64 * 1024 / 1e6 + 0.05)   # the burst is free
    assert d.arrival(1_000_000, now=0.0) == pytest.approx(2.0 - 64 * 1024 / 1e6 + 0.05)   # queued behind it
    jittery = link.Direction(rate_bps=None, delay_s=0.05, jitter_s=0.02, seed=3)
    times = [jittery.arrival(100, now=k * 1e-4) for k in range(200)]
    ordered = []
    last = 0.0
    jittery = link.Direction(rate_bps=None, delay_s=0.05, jitter_s=0.02, seed=3)
    for k in range(200):
        last = jittery.arrival(100, now=k * 1e-4, after=last)
        ordered.append(last)
    assert times != sorted(times) and ordered == sorted(ordered)   # jitter reorders only what TCP would not
    lossy = link.Direction(rate_bps=None, delay_s=0.01, loss=0.01, seed=1)
    late = sum(lossy.arrival(link.SEGMENT * 10, now=0.0) > 0.1 for _ in range(2000))
    assert lossy.retransmits == late and 100 < late < 300          # 1 - 0.99**10 ~ 9.6% of the chunks


def test_profiles_dilate_rates_down_and_delays_up():
    internet = profiles.profile("internet")
    slow = internet.dilated(8)
    assert slow.up_bps == internet.up_bps / 8 and slow.rtt_s == internet.rtt_s * 8
    assert slow.jitter_s == internet.jitter_s * 8
    assert profiles.profile("home").down_bps > profiles.profile("home").up_bps
    custom = profiles.profile("custom", up_mbit=5, rtt_ms=0)
    assert custom.rtt_s == 0 and custom.down_bps == 5e6
    with pytest.raises(ValueError, match="unknown profile"):
        profiles.profile("moon")


def test_strategies_are_built_by_name_from_an_allow_list():
    strategy = harness.build_strategy("LocalSGD", harness.parse_strategy_args(["sync_every=4"]), 3)
    assert (strategy.replicas, strategy.sync_every) == (3, 4)
    assert harness.build_strategy("Pipeline", {}, 2).stages == 2
    with pytest.raises(ValueError, match="unknown strategy"):
        harness.build_strategy("__import__", {}, 2)
    with pytest.raises(ValueError, match="needs sync_every"):
        harness.build_strategy("LocalSGD", {}, 2)
    with pytest.raises(ValueError, match="takes no"):
        harness.build_strategy("LocalSGD", {"sync_every": 4, "speed": 2}, 2)


def test_unequal_providers_are_checked_and_diloco_rounds_built_from_json():
    strategy = harness.build_strategy("DiLoCo", harness.parse_strategy_args(["inner_steps=4", "round=[1,1,0.5,0.25]"]),
                                      4)
    assert strategy.steps == [4, 4, 2, 1] and repr(strategy.round) == "Shares(1, 1, 0.5, 0.25)"
    assert harness.synchronisations(strategy, 4 * 11 * 8, 8, 2) == 8   # 4 rounds an epoch
    assert harness.check_speeds(None, 3, False) == [1.0, 1.0, 1.0]
    assert harness.check_speeds([1, 0.5], 2, True) == [1.0, 0.5]
    with pytest.raises(ValueError, match="need emulated compute"):
        harness.check_speeds([1, 0.5], 2, False)
    with pytest.raises(ValueError, match="one speed > 0 per provider"):
        harness.check_speeds([1, 0.5], 3, True)
    with pytest.raises(ValueError, match="one speed > 0 per provider"):
        harness.check_speeds([1, 0], 2, True)


def test_the_emulated_clock_sleeps_out_the_flops(tmp_path):
    with pytest.raises(ValueError, match="must be > 0"):
        emulated_device.DeviceClock(flops_per_s=0)
    clock = emulated_device.DeviceClock(flops_per_s=1e9, busy_file=str(tmp_path / "busy.json"))
    started = time.monotonic()
    clock.account(started, 5e7)                       # 50 ms at 1 GFLOP/s
    assert time.monotonic() - started >= 0.05 and clock.busy == pytest.approx(0.05)
    assert '"units": 1' in (tmp_path / "busy.json").read_text()
    restarted = emulated_device.DeviceClock(flops_per_s=1e9, busy_file=str(tmp_path / "busy.json"))
    assert restarted.busy == clock.busy and restarted.units == 1   # a provider restarted by churn goes on counting
    assert clock.first <= clock.last and clock.last - clock.first >= 0.05   # wall clock: the first unit's start
    clock.waited("exchange_s", 0.25)
    clock.account(time.monotonic(), 0)
    assert '"exchange_s": 0.25' in (tmp_path / "busy.json").read_text()
    profile = harness.time_profile({}, {"first": 10.0, "last": 30.0, "exchange_s": 4.0, "writes_s": 2.0},
                                   started_at=8.0, ended_at=31.0, dilation=2.0)
    assert profile == {"before_first_s": 1.0, "after_last_s": 0.5, "exchange_s": 2.0, "writes_s": 1.0,
                       "overslept_s": 0.0, "absorbed_s": 0.0}
    assert emulated_device.op_flops("linear", (128, 256), [(128, 784), (256, 784), (256,)], {}) == \
        2 * 128 * 256 * 784


def test_the_emulated_device_makes_up_the_hosts_lag_from_its_slack_but_not_across_a_wait():
    clock = emulated_device.DeviceClock(flops_per_s=1e9)
    clock._lost(0.03)                                 # the host woke 30 ms late after a unit
    clock.account(time.monotonic(), 5e7)              # the next unit, 50 ms, sleeps out only what is left
    assert clock.busy == pytest.approx(0.05) and clock.waits["absorbed_s"] == pytest.approx(0.03)
    assert clock.waits["overslept_s"] >= 0.03 and clock.lag == pytest.approx(clock.waits["overslept_s"] - 0.03)
    clock._lost(0.5)
    clock.waited("exchange_s", 0.001, received=True)  # a receive: the device would have waited for it too
    absorbed = clock.waits["absorbed_s"]
    clock.account(time.monotonic(), 1e7)
    assert clock.lag <= clock.waits["overslept_s"] - 0.53 + 1e-9 and clock.waits["absorbed_s"] == absorbed


def test_the_proxy_never_beats_its_rate_and_tbf_agrees():
    result = tbf_check.check(mbit=50, mbytes=4)
    assert result["proxy_bps"] <= 1.1 * result["configured_bps"]
    assert result["tbf_bps"] <= 1.05 * result["configured_bps"]
    assert result["proxy_bps"] > 0.2 * result["configured_bps"] and result["tbf_bps"] > 0.2 * result["configured_bps"]
    assert leftovers() == ([], [], [])


def test_two_providers_over_shaped_links_are_measured():
    result = harness.run("LocalSGD", {"sync_every": 8}, providers=2, profile=profiles.profile("internet"),
                         rows=2048, batch=128, progress=lambda text: None)
    up = sum(p["bytes_up"] for p in result["providers_detail"])
    down = sum(p["bytes_down"] for p in result["providers_detail"])
    assert up > 0 and down > 0
    # The proxies' counters against the store's own for the same connections.
    assert abs(up - result["store_bytes_in"]) <= 0.1 * result["store_bytes_in"]
    assert abs(down - result["store_bytes_out"]) <= 0.1 * result["store_bytes_out"]
    for p in result["providers_detail"]:
        assert p["compute_s"] > 0 and 0 < p["utilization"] < 1
        assert p["compute_s"] + p["network_wait_s"] == pytest.approx(result["wall_s"])
        # where the wait went: each part measured apart, together no more than it
        parts = [p[k] for k in ("before_first_s", "after_last_s", "exchange_s", "writes_s")]
        assert all(part >= 0 for part in parts) and sum(parts) <= p["network_wait_s"] * 1.01 + 0.01
    assert result["synchronisations"] == 1 and result["test_accuracy"] > 0
    # who ran each replica (over time) and its steps, in the JSON and in --detail's lines
    providers = {p["provider"] for p in result["providers_detail"]}
    assert set(result["contributions"]) == {"replica 0", "replica 1"}
    assert all(set(seen["workers"]) <= providers and seen["steps_done"] == seen["steps"] == 8
               for seen in result["contributions"].values()), result["contributions"]
    assert "  replica 1: " in report.table([result], detail=True)
    assert len(result["pids"]) == 4 and alive(result["pids"]) == []   # the store, the links, 2 providers
    assert leftovers() == ([], [], [])
    assert subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


def test_a_lab_cleans_up_after_an_error():
    with pytest.raises(RuntimeError, match="boom"):
        with Lab() as lab:
            lab.start_store()
            lab.add_namespace("err")
            raise RuntimeError("boom")
    assert leftovers() == ([], [], [])


def test_the_lab_fails_at_once_naming_a_process_of_its_own_that_died():
    # A store, proxies or providers dying while the harness waits for progress used to stall the run until its
    # timeout (wan_lab.md, the first N=8 churn attempt). A stand-in process plays the provider: what is checked is
    # the lab noticing an exit, and a real worker's start would only add its torch import.
    unshaped = {"up": {"rate_bps": None, "delay_s": 0.0}, "down": {"rate_bps": None, "delay_s": 0.0}}
    with Lab() as lab:
        lab.start_store()
        lab.start_links({"provider-0": unshaped})
        provider = lab.workers["provider-0"] = lab._spawn([sys.executable, "-c", "import time; time.sleep(120)"])
        lab.check_alive()
        provider.kill()
        provider.wait()
        lab.check_alive(down={"provider-0"})   # killed by the churn, restart pending: not a failure
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"provider provider-0 \(killed by SIGKILL\)"):
            harness.watch_progress(lab, "no-such-token", started, 60, [])
        lab.store.kill()
        lab.store.wait()
        with pytest.raises(RuntimeError, match=r"lost the store \(killed by SIGKILL\); its log ends"):
            harness.watch_progress(lab, "no-such-token", started, 60, [], {"provider-0"})
        assert time.monotonic() - started < 10
    assert leftovers() == ([], [], [])


def test_churn_figures_count_the_samples_of_rounds_closed_without_a_replica_apart():
    undisturbed = {"samples_per_s": 100.0, "wall_s": 100.0}
    churned = {"samples_per_s": 80.0, "wall_s": 125.0, "rows": 1000, "epochs": 10,
               "churn": {"events": [{"killed_s": 60.0}, {"killed_s": 120.0}], "progress_over_time": [],
                         "every_s": 60.0, "restart_after_s": 10.0},
               "contributions": {"replica 0": {"rounds_without": [], "samples_per_round": 500},
                                 "replica 1": {"rounds_without": [3, 7], "samples_per_round": 500}}}
    __main__.churn_figures(undisturbed, churned)
    churn = churned["churn"]
    assert churn["goodput"] == 0.8 and churn["lost_s_per_kill"] == 12.5
    assert churn["dropped_samples"] == 1000 and churn["useful_goodput"] == pytest.approx(9000 / 125 / 100)
    assert "(72% counting only the samples of rounds that went with their replica: 1000 dropped)" in \
        report.table([{**churned, "strategy": "DiLoCo", "compute": "emulated", "providers": 2, "profile_name": "x",
                       "compute_s": 1, "network_wait_s": 1, "utilization": 0.5, "bytes_per_sync": 1, "bytes_up": 1,
                       "bytes_down": 1, "final_loss": 0.1, "test_accuracy": 0.9,
                       "one_worker": {"test_accuracy": 0.9}}])


def test_emulated_providers_compute_at_the_emulated_rate():
    # 154 MFLOP a step at 2e10 / 2 FLOP/s: 15 ms of dilated time, more than a step really takes on one core.
    result = harness.run("LocalSGD", {"sync_every": 8}, providers=2, profile=profiles.profile("internet"),
                         emulate=True, device_flops=2e10, dilation=2.0, rows=2048, batch=128,
                         progress=lambda text: None)
    for p in result["providers_detail"]:
        assert p["flops"] > 8 * 1e8                                   # 8 steps of the MLP were counted
        assert p["compute_s"] >= p["flops"] / 2e10 * (1 - 1e-9)      # never faster than the emulated device
        assert 0 < p["utilization"] < 1
    assert result["dilation"] == 2.0 and result["compute"] == "emulated"
    assert alive(result["pids"]) == [] and leftovers() == ([], [], [])
