"""Validation of the compute emulation: the same run at N=2 with real compute, then with emulated compute at the
FLOP/s the real providers achieved (their FLOPs over their compute time), slowed down `dilation` times (links
too); utilization must agree within 5 points.

    python -m benchmarks.wan.validate --strategy LocalSGD --strategy-arg sync_every=16 --profile internet \\
        --dilation 4 [--rows 16384] [--json out.json]
"""
import argparse
import json
import sys

from . import harness, report
from .profiles import profile


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wan.validate", description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="LocalSGD", choices=harness.STRATEGIES)
    parser.add_argument("--strategy-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a keyword argument of the strategy (LocalSGD needs sync_every=...)")
    parser.add_argument("--profile", default="internet")
    parser.add_argument("--dilation", type=float, default=4.0)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    common = dict(strategy_name=args.strategy, strategy_args=harness.parse_strategy_args(args.strategy_arg),
                  providers=2, profile=profile(args.profile), rows=args.rows, batch=args.batch, epochs=args.epochs,
                  hidden=args.hidden, progress=lambda text: print(text, file=sys.stderr, flush=True))
    real = harness.run(**common)
    achieved = sum(p["flops"] for p in real["providers_detail"]) / \
        sum(p["real_compute_s"] for p in real["providers_detail"])
    emulated = harness.run(**common, emulate=True, device_flops=achieved, dilation=args.dilation)
    print(report.table([real, emulated], detail=True))
    gap = abs(real["utilization"] - emulated["utilization"])
    print(f"real providers achieved {achieved:.3g} FLOP/s; emulated at that rate, dilation {args.dilation:g}: "
          f"utilization {real['utilization']:.1%} real vs {emulated['utilization']:.1%} emulated "
          f"({gap * 100:.1f} points apart; {'within' if gap <= 0.05 else 'NOT within'} 5)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"real": real, "emulated": emulated, "achieved_flops_per_s": achieved,
                       "gap_points": gap * 100}, f, indent=1)


if __name__ == "__main__":
    try:
        main()
    except ValueError as exc:   # bad flags: say which, without a traceback
        sys.exit(f"python -m benchmarks.wan.validate: {exc}")
