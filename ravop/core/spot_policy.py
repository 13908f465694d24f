"""Adaptive spot checks (`R.Graph(verify='spot')`, `R.Verify(...)`): the policy's knobs, how they travel in a
graph's meta, and how a worker's trust is spelled in the store. The decisions themselves (checked or not, who
won a dispute) are made by the server-side script `SPOT` (ravop/store/spot_scripts.py), never by a worker.

A worker's result is re-run by `copies - 1` other workers and compared by digest on every result until the
worker has `trust_after` consecutive confirmed results (per requester token and device type), then with
probability `rate`. The draw is made after the worker has handed in the digest of its result, so it cannot
tell a checked result from an unchecked one before it has returned it. Any mismatch resets its trust."""
from dataclasses import dataclass
from typing import Optional, Union

DEFAULT_RATE = 0.1
DEFAULT_TRUST_AFTER = 10
DEFAULT_COPIES = 2


@dataclass(frozen=True)
class Verify:
    """`R.Graph(verify=R.Verify(rate=0.1, trust_after=10, copies=2))`: adaptive spot checks with these knobs
    (`verify='spot'` is this with the defaults). `rate`: the chance that a trusted worker's result is checked;
    `trust_after`: consecutive confirmed results that make a worker trusted; `copies`: runs compared per check
    (the worker's and `copies - 1` others')."""
    rate: float = DEFAULT_RATE
    trust_after: int = DEFAULT_TRUST_AFTER
    copies: int = DEFAULT_COPIES

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

    def encode(self) -> str:
        """How the graph's meta holds it (field `spot`): "rate;trust_after;copies"."""
        return f"{float(self.rate)!r};{self.trust_after};{self.copies}"

    @classmethod
    def decode(cls, text: Union[str, bytes]) -> "Verify":
        if isinstance(text, bytes):
            text = text.decode()
        try:
            rate, trust_after, copies = text.split(";")
            return cls(float(rate), int(trust_after), int(copies))
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


def trust_member(worker: str, kind: str) -> str:
    """Who trust is kept for: one worker on one device type ("w-1@cpu")."""
    return f"{worker}@{kind}"


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
