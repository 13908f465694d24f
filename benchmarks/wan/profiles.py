"""Link profiles: what a provider's path to the store looks like, per direction ("up": provider -> store).

Delays are round trips, split evenly between the directions. `home` is an asymmetric consumer line: 20 Mbit/s
up (the issue's figure) and 100 Mbit/s down (a common plan; the issue names only the upload).
"""
from dataclasses import dataclass, replace

MBIT = 1e6


@dataclass(frozen=True)
class Profile:
    name: str
    up_bps: float
    down_bps: float
    rtt_s: float
    jitter_s: float = 0.0
    loss: float = 0.0

    def dilated(self, factor):
        """The same link seen by a run `factor` times slower than real time: rates / factor, delays x factor."""
        if not factor > 0:
            raise ValueError(f"the dilation factor must be > 0, not {factor!r}")
        return replace(self, up_bps=self.up_bps / factor, down_bps=self.down_bps / factor,
                       rtt_s=self.rtt_s * factor, jitter_s=self.jitter_s * factor)

    def link_config(self, rto_min_s=0.2):
        """The `benchmarks.wan.link` spec of both directions (the RTO floor dilates with the delays)."""
        one_way = self.rtt_s / 2
        return {"up": {"rate_bps": self.up_bps, "delay_s": one_way, "jitter_s": self.jitter_s, "loss": self.loss,
                       "rto_min_s": rto_min_s},
                "down": {"rate_bps": self.down_bps, "delay_s": one_way, "jitter_s": self.jitter_s,
                         "loss": self.loss, "rto_min_s": rto_min_s}}

    def describe(self):
        rate = (f"{self.up_bps / MBIT:g} Mbit/s" if self.up_bps == self.down_bps
                else f"{self.up_bps / MBIT:g} Mbit/s up, {self.down_bps / MBIT:g} down")
        extra = (f", {self.jitter_s * 1e3:g} ms jitter" if self.jitter_s else "") + \
                (f", {self.loss:.2%} loss" if self.loss else "")
        return f"{self.name}: {rate}, {self.rtt_s * 1e3:g} ms RTT{extra}"


PROFILES = {
    "datacenter": Profile("datacenter", 10_000 * MBIT, 10_000 * MBIT, 0.5e-3),
    "region": Profile("region", 1_000 * MBIT, 1_000 * MBIT, 10e-3),
    "internet": Profile("internet", 100 * MBIT, 100 * MBIT, 50e-3, jitter_s=1e-3),
    "home": Profile("home", 20 * MBIT, 100 * MBIT, 100e-3, loss=0.001),
}


def profile(name, up_mbit=None, down_mbit=None, rtt_ms=None, jitter_ms=None, loss=None):
    """A named profile with any of its figures overridden, or `custom` built from the figures alone."""
    if name == "custom":
        if up_mbit is None or rtt_ms is None:
            raise ValueError("the custom profile needs at least --up-mbit and --rtt-ms")
        base = Profile("custom", up_mbit * MBIT, (down_mbit or up_mbit) * MBIT, rtt_ms / 1e3)
    elif name in PROFILES:
        base = PROFILES[name]
    else:
        raise ValueError(f"unknown profile {name!r}: one of {', '.join([*PROFILES, 'custom'])}")
    given = {"up_bps": None if up_mbit is None else up_mbit * MBIT,
             "down_bps": None if down_mbit is None else down_mbit * MBIT,
             "rtt_s": None if rtt_ms is None else rtt_ms / 1e3,
             "jitter_s": None if jitter_ms is None else jitter_ms / 1e3, "loss": loss}
    return replace(base, **{key: value for key, value in given.items() if value is not None})
