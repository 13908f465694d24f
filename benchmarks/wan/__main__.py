"""The WAN lab: N providers behind emulated links (rate, delay, jitter, loss) train one model with a strategy of
R.parallel; prints the table (benchmarks/wan/report.py) and writes every figure as JSON.

    python -m benchmarks.wan --strategy LocalSGD --strategy-arg sync_every=16 --providers 2 --profile internet
    python -m benchmarks.wan --strategy LocalSGD --strategy-arg sync_every=16 --providers 8 --profile internet \\
        --emulate --device-flops 2e10 --dilation 8
    python -m benchmarks.wan --strategy DiLoCo --strategy-arg inner_steps=8 --strategy-arg 'round=[1,1,0.5,0.25]' \
        --providers 4 --emulate --device-flops 2e9 --speeds 1,1,0.5,0.25 --detail   # unequal providers
    python -m benchmarks.wan ... --churn-every 60 --churn-restart 10      # and the same run undisturbed first
    python -m benchmarks.wan.tbf_check --mbit 100                         # the proxy's rate against tbf

See docs/reports/wan_lab.md for what is emulated and how.
"""
import argparse
import json
import sys

from worker.loops.loop_subgraph import CHECKPOINT_SECONDS, CHECKPOINT_STEPS, RESIDENT_CHECKPOINT_SECONDS

from . import harness, report
from .profiles import PROFILES, profile


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wan", description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", required=True, choices=harness.STRATEGIES)
    parser.add_argument("--strategy-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a keyword argument of the strategy (JSON value); replicas/stages default to --providers")
    parser.add_argument("--providers", type=int, default=2)
    parser.add_argument("--profile", default="internet", choices=[*PROFILES, "custom", "none"],
                        help="the links' profile ('none': unshaped, counted only)")
    parser.add_argument("--up-mbit", type=float)
    parser.add_argument("--down-mbit", type=float)
    parser.add_argument("--rtt-ms", type=float)
    parser.add_argument("--jitter-ms", type=float)
    parser.add_argument("--loss", type=float)
    parser.add_argument("--emulate", action="store_true", help="emulated compute (worker --emulate-device-flops)")
    parser.add_argument("--device-flops", type=float, help="FLOP/s of the device an emulated provider stands for")
    parser.add_argument("--speeds", type=lambda text: [float(s) for s in text.split(",")],
                        help="each provider's speed as a multiple of --device-flops, e.g. 1,1,0.5,0.25")
    parser.add_argument("--dilation", type=float, default=1.0, help="time dilation factor (with --emulate)")
    parser.add_argument("--rows", type=int, default=4096, help="training rows (all providers together)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256, help="the MLP's hidden width (784-H-10)")
    parser.add_argument("--churn-every", type=float, help="SIGKILL a provider every this many seconds")
    parser.add_argument("--churn-restart", type=float, default=10.0, help="... and restart it this much later")
    parser.add_argument("--checkpoint-seconds", type=float, default=CHECKPOINT_SECONDS,
                        help="the providers' loops checkpoint every this many (undilated) seconds ...")
    parser.add_argument("--checkpoint-steps", type=int, default=None,
                        help="... or this many steps, whichever comes first (0: never by steps; default: "
                             f"{CHECKPOINT_STEPS}, none for resident replicas)")
    parser.add_argument("--resident-checkpoint-seconds", type=float, default=RESIDENT_CHECKPOINT_SECONDS,
                        help="resident replicas checkpoint at a synchronisation every this many (undilated) "
                             "seconds (or --checkpoint-steps when given)")
    parser.add_argument("--timeout", type=float, default=1800, help="fail a run not done after this many (undilated) s")
    parser.add_argument("--records-every", type=float,
                        help="print each loop's steps, holders, takeovers and checkpoint every this many s")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--detail", action="store_true", help="a line per provider")
    return parser.parse_args(argv)


def churn_figures(undisturbed, churned):
    """Goodput (samples/s with churn over without; `useful_goodput` counts only the samples of rounds that went
    with their replica), the seconds lost per kill (the churned run's extra
    wall time over the kills), and per kill the stall: the longest time without progress (loop steps done) in
    the 30 s after it (the surviving providers keep going; the killed one's work is taken over once idle for
    the workers' --reclaim-idle, 5 s here)."""
    churn = churned["churn"]
    churn["goodput"] = churned["samples_per_s"] / undisturbed["samples_per_s"]
    churn["undisturbed_samples_per_s"] = undisturbed["samples_per_s"]
    # a round that closed without a replica (DiLoCo's close_after) did not train on its samples
    churn["dropped_samples"] = sum(len(role.get("rounds_without", [])) * role.get("samples_per_round", 0)
                                   for role in churned["contributions"].values())
    useful = churned["rows"] * churned["epochs"] - churn["dropped_samples"]
    churn["useful_goodput"] = useful / churned["wall_s"] / undisturbed["samples_per_s"]
    kills = len(churn["events"])
    churn["lost_s_per_kill"] = (churned["wall_s"] - undisturbed["wall_s"]) / kills if kills else None
    progress = churn["progress_over_time"]
    stalls = []
    for event in churn["events"]:
        window = [(t, p) for t, p in progress if event["killed_s"] <= t <= event["killed_s"] + 30]
        longest = 0.0
        if window:
            changed_at, level = window[0]
            for t, p in window:
                if p != level:
                    changed_at, level = t, p
                longest = max(longest, t - changed_at)
        stalls.append(longest)
    churn["stalls_s"] = stalls


def main(argv=None):
    args = parse_args(argv)
    link = None if args.profile == "none" else profile(args.profile, args.up_mbit, args.down_mbit, args.rtt_ms,
                                                        args.jitter_ms, args.loss)
    common = dict(strategy_name=args.strategy, strategy_args=harness.parse_strategy_args(args.strategy_arg),
                  providers=args.providers, profile=link, emulate=args.emulate, device_flops=args.device_flops,
                  dilation=args.dilation, speeds=args.speeds, rows=args.rows, batch=args.batch, epochs=args.epochs, hidden=args.hidden,
                  checkpoint_seconds=args.checkpoint_seconds, checkpoint_steps=args.checkpoint_steps,
                  resident_checkpoint_seconds=args.resident_checkpoint_seconds, timeout=args.timeout,
                  report_every=args.records_every,
                  progress=lambda text: print(text, file=sys.stderr, flush=True))
    results = [harness.run(**common)]
    if args.churn_every:   # the undisturbed run's figures now, in case the churned one never ends
        print(report.table(results, detail=args.detail), file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        results.append(harness.run(**common, churn_every=args.churn_every, churn_restart=args.churn_restart))
        churn_figures(results[0], results[1])
    print(report.table(results, detail=args.detail))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    try:
        main()
    except ValueError as exc:   # bad flags: say which, without a traceback
        sys.exit(f"python -m benchmarks.wan: {exc}")
