"""What a DiLoCo round is when its replicas run at unequal speeds (hivemind's target batch, Decoupled DiLoCo):
a budget of samples that each replica fills in proportion to its speed, instead of the same inner steps for all.

`Shares(1, 1, 0.5, 0.25)` is a schedule fixed in advance: the replica of the largest share runs `inner_steps`
steps per round, replica r `inner_steps * share[r] / max(shares)` (a whole number), so the fast providers are not
left waiting for the slow ones at every round. Each replica's shard of the data holds the same number of rounds
(its shard is in proportion to its steps), so every replica still sees each of its rows once per epoch, the fit
still covers the data `n_epochs` times, and the pseudo-gradients are averaged weighted by the samples each
contains. The schedule is part of the recorded graph: the same schedule, data and seed give the same bits, on
any workers, resident or as segments.

A round closed by a wall-clock budget (each replica runs as many steps as fit in T seconds) would keep every
provider busy whatever its speed, but its steps per replica, hence its bits, would depend on the machine's load:
not offered, since a fit here is a graph recorded before it runs; measure the providers' speeds and give them
as `Shares` (benchmarks/wan --speeds shows the effect)."""
from fractions import Fraction
from typing import List, Optional, Sequence


class Shares:
    """Each replica's part of a round's samples, in proportion (see the module docstring)."""

    def __init__(self, *shares: float) -> None:
        if not shares:
            raise ValueError("Shares needs one share per replica, e.g. Shares(1, 1, 0.5, 0.25)")
        for share in shares:
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0:
                raise ValueError(f"a replica's share must be a number > 0, not {share!r}")
        self.shares = tuple(float(share) for share in shares)

    def steps(self, inner_steps: int) -> List[int]:
        """Each replica's inner steps per round, the largest share's being `inner_steps`."""
        top = Fraction(max(self.shares))
        steps = [Fraction(inner_steps) * Fraction(share) / top for share in self.shares]
        if any(s.denominator != 1 for s in steps):
            raise ValueError(f"{self!r} with inner_steps={inner_steps} gives replicas "
                             f"{', '.join(f'{float(s):g}' for s in steps)} steps per round: a round's steps must be "
                             "whole (pick inner_steps a multiple of the shares' denominators)")
        return [int(s) for s in steps]

    def __repr__(self) -> str:
        return f"Shares({', '.join(f'{share:g}' for share in self.shares)})"


def check_round(round_: object, replicas: int) -> Optional[Shares]:
    if round_ is None:
        return None
    if not isinstance(round_, Shares):
        raise TypeError(f"round takes None (every replica runs inner_steps per round) or R.parallel.Shares(...) "
                        f"(a round's samples split among the replicas in proportion to their speed), not {round_!r}")
    if len(round_.shares) != replicas:
        raise ValueError(f"round={round_!r} gives {len(round_.shares)} shares for {replicas} replicas: give one "
                         "per replica")
    return round_


def shard_rows(steps: Sequence[int], n_rows: int, rows_per_step: int) -> List[int]:
    """Each replica's shard of `n_rows` when replica r runs `steps[r]` steps of `rows_per_step` rows per round:
    the same whole number of rounds in every shard."""
    unit = rows_per_step * sum(steps)
    if n_rows % unit or not n_rows:
        lower, upper = n_rows - n_rows % unit, n_rows - n_rows % unit + unit
        raise ValueError(f"{n_rows} rows do not split into whole rounds of {list(steps)} steps of {rows_per_step} "
                         f"rows (a round reads {unit} rows): give a multiple of {unit}, e.g. "
                         f"{' or '.join(str(n) for n in (lower, upper) if n)}")
    return [n_rows // unit * rows_per_step * s for s in steps]
