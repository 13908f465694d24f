"""The WAN lab's table: one row per run (real and emulated rows marked as such) and, with `--detail`, one per
provider; churn runs add goodput and recovery times."""
import re

# Arguments left at their defaults, dropped from the table's strategy column.
_DEFAULTS = re.compile(r", (average_optim=False|interpolation='constant'|factor=0\.5|divergence_threshold=0\.0"
                       r"|replicas=1)(?=[,)])")


def _mb(n):
    return f"{n / 1e6:.2f}"


HEADER = (f"{'strategy':<36}{'compute':>9}{'N':>3} {'profile':<11}{'wall s':>8}{'comp s':>8}{'wait s':>8}"
          f"{'util':>6}{'MB/sync':>9}{'MB up':>8}{'MB dn':>8}{'smp/s':>8}{'loss':>7}{'acc':>6}{'1w acc':>7}")


def row(result):
    return (f"{_DEFAULTS.sub('', result['strategy']):<36}{result['compute']:>9}{result['providers']:>3} "
            f"{result['profile_name'] or '-':<11}{result['wall_s']:>8.2f}{result['compute_s']:>8.2f}"
            f"{result['network_wait_s']:>8.2f}{result['utilization']:>6.0%}{_mb(result['bytes_per_sync']):>9}"
            f"{_mb(result['bytes_up']):>8}{_mb(result['bytes_down']):>8}{result['samples_per_s']:>8.0f}"
            f"{result['final_loss']:>7.3f}{result['test_accuracy']:>6.3f}{result['one_worker']['test_accuracy']:>7.3f}")


def provider_rows(result):
    for p in result["providers_detail"]:
        real = "" if result["compute"] == "real" else \
            f" (kernels took {p['real_compute_s']:.2f} s of its {p['compute_s'] * result['dilation']:.2f} s dilated)"
        speed = "" if p.get("device_flops") is None else \
            f"{p['device_flops']:.3g} FLOP/s, {p['flops'] / (result['wall_s'] * p['device_flops']):.0%} of it used, "
        roles = f" ({', '.join(p['roles'])})" if p.get("roles") else ""
        yield (f"  {p['provider'] + roles:<14} {speed}compute {p['compute_s']:.2f} s{real}, network "
               f"wait {p['network_wait_s']:.2f} s, utilization {p['utilization']:.0%}, up {_mb(p['bytes_up'])} MB "
               f"({_mb(p['bytes_up_per_sync'])}/sync), down {_mb(p['bytes_down'])} MB "
               f"({_mb(p['bytes_down_per_sync'])}/sync), retransmits {p['retransmits']}")
        if "before_first_s" in p:
            yield (f"  {'':<14} wait: {p['before_first_s']:.2f} s before its first step, {p['exchange_s']:.2f} s in "
                   f"exchanges, {p['writes_s']:.2f} s writing (losses, checkpoints), {p['after_last_s']:.2f} s after "
                   f"its last step")
        if p.get("overslept_s"):
            yield (f"  {'':<14} emulation: the host ran {p['overslept_s']:.2f} s behind the device (late wake-ups, "
                   f"the busy file), {p['absorbed_s']:.2f} s of it made up from later steps' slack")


def table(results, detail=False):
    lines = [HEADER]
    for result in results:
        lines.append(row(result))
        if detail:
            lines.extend(provider_rows(result))
            lines.extend(f"  {role}: {' -> '.join(seen['workers'])} (over time), {seen['steps_done']} steps, "
                         f"{len(seen['rounds_without'])} of {seen['rounds']} rounds closed without it"
                         for role, seen in result.get("contributions", {}).items())
            lines.append(f"  link process CPU: {result['link_cpu_s']:.2f} s ({result['link_cpu_share']:.1%} of the "
                         f"run's wall time); dilation {result['dilation']:g}; synchronisations "
                         f"{result['synchronisations']}; load average {result['machine_load'][0]:.2f}")
        if result.get("fleet_utilization") is not None:
            lines.append(f"  fleet compute used: {result['fleet_utilization']:.0%} (FLOPs computed / wall x the "
                         f"fleet's {sum(p['device_flops'] for p in result['providers_detail']):.3g} FLOP/s; speeds "
                         f"{', '.join(f'{s:g}' for s in result['speeds'])})")
        if result.get("churn"):
            churn = result["churn"]
            lines.append(f"  churn: a provider killed every {churn['every_s']:g} s, restarted after "
                         f"{churn['restart_after_s']:g} s: {len(churn['events'])} kills; goodput "
                         f"{_fmt(churn.get('goodput'))} of the undisturbed run's samples/s"
                         + (f" ({_fmt(churn['useful_goodput'])} counting only the samples of rounds that went with "
                            f"their replica: {churn['dropped_samples']} dropped)" if churn.get("dropped_samples") else "")
                         + "; "
                         f"{_seconds(churn.get('lost_s_per_kill'))} lost per kill; longest stall after a kill "
                         f"{', '.join(f'{r:.1f} s' for r in churn.get('stalls_s', [])) or '-'}")
    return "\n".join(lines)


def _seconds(value):
    return "-" if value is None else f"{value:.1f} s"


def _fmt(value):
    return "-" if value is None else f"{value:.0%}"


def main(argv=None):
    """`python -m benchmarks.wan.report RESULTS.json...`: the table of runs written with --json."""
    import argparse
    import json
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wan.report", description=main.__doc__)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--detail", action="store_true")
    args = parser.parse_args(argv)
    results = []
    for path in args.files:
        with open(path) as f:
            loaded = json.load(f)
        results.extend(loaded if isinstance(loaded, list) else [loaded["real"], loaded["emulated"]])
    print(table(results, detail=args.detail))


if __name__ == "__main__":
    main()
