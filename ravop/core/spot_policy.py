"""Adaptive spot checks (`R.Graph(verify='spot')`, `R.Verify(...)`): the policy's knobs, how they travel in a
graph's meta, and how a worker's trust is spelled in the store. The decisions themselves (checked or not, who
won a dispute) are made by the server-side script `SPOT` (ravop/store/spot_scripts.py), never by a worker.

A worker's result is re-run by `copies - 1` other workers and compared by digest on every result until the
worker has `trust_after` consecutive confirmed results (per requester token and device type), then with
probability `rate`. The draw is a hash of the graph, the result and the worker's principal, which the requester
verifies when the graph ends (ravop.store.votes.drawn): a worker cannot skip a drawn check unnoticed, though one
running modified code can compute which of its results will be drawn. Any mismatch resets its trust.

Honest workers of different numerics classes (ravop/core/numerics_class.py) may differ in the last bits, so a
re-run goes to a worker of the runner's class where one of another user is live; a checker of another class
vouches for the runner when their values differ by at most `tolerance` (see `scaled_difference`). Votes and
trust are per principal, the worker's ACL user: runs of one user count once, and a re-run never goes to the user
whose run it checks. A check that cannot settle within `settle_seconds` ends with a verdict (accepted
unverified, or the graph fails) instead of waiting for a worker that may never come."""
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Optional, Union

DEFAULT_RATE = 0.1
DEFAULT_TRUST_AFTER = 10
DEFAULT_COPIES = 2
# Measured (benchmarks/bench_verify.py part 4, `scaled_difference` over parameters and Adam's moments, digits-
# shaped MLP and CNN from one state): honest classes <= 7.8e-7 apart after 10 steps (a CNN up to 5.5e-3 after
# 100), a +1e-4 perturbation of one layer's output >= 6.4e-5 after 10 steps, the cheats of issue 42 further still.
# 1e-5 over segments of at most SPOT_SEGMENT_STEPS sits >10x over the honest spread and >6x under that cheat.
DEFAULT_TOLERANCE = 1e-5
DEFAULT_SETTLE_SECONDS = 120.0
# A spot-checked loop checkpoints (ends a segment) at least this often: honest drift across classes grows with
# the steps of a segment (a CNN's passes the tolerance within 100 steps), so segments stay short.
SPOT_SEGMENT_STEPS = 10


@dataclass(frozen=True)
class Verify:
    """`R.Graph(verify=R.Verify(rate=0.1, trust_after=10, copies=2))`: adaptive spot checks with these knobs
    (`verify='spot'` is this with the defaults). `rate`: the chance that a trusted worker's result is checked;
    `trust_after`: consecutive confirmed results that make a worker trusted; `copies`: runs compared per check
    (the worker's and `copies - 1` others'); `tolerance`: the largest `scaled_difference` at which a check of
    another numerics class vouches for a result; `settle_seconds`: how long a check may wait for workers of
    other users before it ends (unverified, or the graph fails on a dispute nobody broke)."""
    rate: float = DEFAULT_RATE
    trust_after: int = DEFAULT_TRUST_AFTER
    copies: int = DEFAULT_COPIES
    tolerance: float = DEFAULT_TOLERANCE
    settle_seconds: float = DEFAULT_SETTLE_SECONDS

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not 0 <= self.rate <= 1:
            raise ValueError(f"Verify(rate=...) is the chance that a trusted worker's result is checked, a number "
                             f"from 0 to 1, not {self.rate!r}")
        if type(self.trust_after) is not int or self.trust_after < 0:
            raise ValueError(f"Verify(trust_after=...) counts consecutive confirmed results, an int >= 0, not "
                             f"{self.trust_after!r}")
        if type(self.copies) is not int or not 2 <= self.copies <= 9:
            raise ValueError(f"Verify(copies=...) is the number of runs compared per check, an int from 2 to 9, "
                             f"not {self.copies!r}")
        for knob in ("tolerance", "settle_seconds"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"Verify({knob}=...) must be a positive finite number, not {value!r}")

    def encode(self) -> str:
        """How the graph's meta holds it (field `spot`): "rate;trust_after;copies;tolerance;settle_seconds"."""
        return f"{float(self.rate)!r};{self.trust_after};{self.copies};{float(self.tolerance)!r};" \
               f"{float(self.settle_seconds)!r}"

    @classmethod
    def decode(cls, text: Union[str, bytes]) -> "Verify":
        if isinstance(text, bytes):
            text = text.decode()
        try:
            rate, trust_after, copies, tolerance, settle = text.split(";")
            return cls(float(rate), int(trust_after), int(copies), float(tolerance), float(settle))
        except ValueError as exc:
            raise ValueError(f"malformed spot-check policy {text!r} in a graph's meta: {exc}") from None


def parse_verify(verify: object) -> tuple[int, Optional[Verify]]:
    """(copies for k-fold checking, spot-check policy or None) of `R.Graph(verify=...)`: a positive int, 'spot'
    or a `Verify`; ValueError naming what is wrong otherwise."""
    if isinstance(verify, Verify):
        return 1, verify
    if verify == "spot":
        return 1, Verify()
    if type(verify) is not int or verify < 1:
        raise ValueError(f"verify must be a positive int (the workers that run each subgraph), 'spot' or "
                         f"R.Verify(rate=, trust_after=, copies=) (adaptive spot checks), not {verify!r}")
    return verify, None


def trust_member(principal: str, numerics_class: str) -> str:
    """Who trust is kept for: one principal (a worker's ACL user) in one numerics class ("alice@cpu/torch...")."""
    return f"{principal}@{numerics_class}"


def principal_of(acl_user: str, worker: str) -> str:
    """Whose vote a worker's is: its ACL user, or its own name on a server without users (the default user
    names nobody: every worker of an open server is its own principal). ValueError for a name that the SPOT
    script's separators would split."""
    principal = worker if acl_user == "default" else acl_user
    if not principal or any(c in principal for c in ":,@;# "):
        raise ValueError(f"a worker's principal (ACL user or worker name) may not be empty nor hold any of "
                         f"': , @ ; #' or a space, not {principal!r}")
    return principal


def scaled_difference(mine: list, theirs: list) -> float:
    """How far two runs' values are apart: over the values, the largest root mean square of |a - b| / (1 + |b|)
    (absolute for small elements, relative for large ones); inf where a value's dtype or shape differs or where
    values that are not floating point differ at all (counters, masks and random states agree exactly). The mean
    over a value's elements, not its largest element: Adam turns rounding noise in a near-zero gradient into a
    step of up to `lr` in that one element (honest classes part by 5.5e-5 in one element of a CNN's weights
    after 10 steps, 8e-7 in RMS), while a wrong kernel moves every element it feeds."""
    import torch

    if len(mine) != len(theirs):
        return float("inf")
    worst = 0.0
    for a, b in zip(mine, theirs):
        if a.dtype != b.dtype or a.shape != b.shape:
            return float("inf")
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return float("inf")
            continue
        if a.numel():
            a64, b64 = a.double(), b.double()
            diff = ((a64 - b64).abs() / (1 + b64.abs())).masked_fill((a64 == b64) | (a64.isnan() & b64.isnan()), 0)
            worst = max(worst, diff.nan_to_num(nan=float("inf")).pow(2).mean().sqrt().item())
    return worst


TRUST_FIELDS = ("streak", "confirmed", "mismatches", "unchecked")


def trust_field(member: str, what: str) -> str:
    """A field of a token's trust hash: "w-1@cpu:streak" (consecutive confirmed results), ":confirmed",
    ":mismatches", ":unchecked" (results accepted without a check)."""
    return f"{member}:{what}"


def read_trust(raw: dict) -> dict:
    """{member: {streak, confirmed, mismatches, unchecked}} of a token's trust hash as HGETALL returns it."""
    table: dict = {}
    for field, value in raw.items():
        field = field.decode() if isinstance(field, bytes) else field
        member, _, what = field.rpartition(":")
        if what in TRUST_FIELDS and member:
            table.setdefault(member, dict.fromkeys(TRUST_FIELDS, 0))[what] = int(value)
    return table


def tally(votes: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(agreeing principals, outvoted principals) of {principal: digest}: the agreeing ones hold a strict majority's
    digest; with no strict majority nobody is outvoted (there is no telling who is wrong)."""
    if not votes:
        return [], []
    digest_, count = Counter(votes.values()).most_common(1)[0]
    if count * 2 <= len(votes):
        return [], []
    return (sorted(w for w, d in votes.items() if d == digest_), sorted(w for w, d in votes.items() if d != digest_))
