"""The rules of a federated graph: which columns a provider keeps, the range of values it keeps in each, how
many providers take part, and the smallest group a statistic may describe.

    {"rules": {"age": {"min": 18, "max": 80}, "fund": {}}, "max_clients": 2, "min_group_size": 10}

Two modes protect the providers further (docs/users/federated.md says what each reveals to whom):

    "privacy": {"epsilon": 0.5, "delta": 0}   each provider adds calibrated noise to what it releases and
                                              spends epsilon of its budget (`ravop.federated.privacy`); every
                                              rule then needs both min and max, the sensitivity's bounds
    "secure": true                            providers mask their partials so that only their sum can be read
                                              (`ravop.federated.secure`); needs max_clients >= 2

A rule keeps the values v of its column with min <= v <= max (either bound may be left out; `{}` keeps every
value). `max_clients` (default 1) is the number of providers whose data is merged. `min_group_size` asks for
a larger k than the providers' own (`ravop-worker --min-group-size`); it can only raise theirs. The rules travel
to the providers through Redis, so the providers parse them with the same function: JSON, never code.
"""
import json
import math
from typing import Any, Dict, Optional, Tuple, Union

Bound = Optional[float]

KEYS = ("rules", "max_clients", "min_group_size", "privacy", "secure")
PRIVACY_KEYS = ("epsilon", "delta")
BOUNDS = ("min", "max")


class Rules:
    __slots__ = ("columns", "max_clients", "min_group_size", "privacy", "secure")

    def __init__(self, columns: Dict[str, Tuple[Bound, Bound]], max_clients: int = 1, min_group_size: int = 1,
                 privacy: Optional[Tuple[float, float]] = None, secure: bool = False) -> None:
        self.columns = columns                  # column -> (low or None, high or None), in the given order
        self.max_clients = max_clients
        self.min_group_size = min_group_size
        self.privacy = privacy                  # (epsilon, delta) of this query, or None
        self.secure = secure

    def to_json(self) -> str:
        rules = {name: {bound: value for bound, value in zip(BOUNDS, limits) if value is not None}
                 for name, limits in self.columns.items()}
        spec = {"rules": rules, "max_clients": self.max_clients, "min_group_size": self.min_group_size}
        if self.privacy:
            spec["privacy"] = dict(zip(PRIVACY_KEYS, self.privacy))
        if self.secure:
            spec["secure"] = True
        return json.dumps(spec)

    def describe_columns(self) -> str:
        return ", ".join(self.columns)


def parse_rules(rules: Union[str, bytes, Dict[str, Any]]) -> Rules:
    """A `Rules` from a JSON string (or the dict it encodes); ValueError naming what is wrong."""
    if isinstance(rules, (str, bytes)):
        try:
            rules = json.loads(rules)
        except ValueError as exc:
            raise ValueError(f"rules is not valid JSON: {exc}") from None
    if not isinstance(rules, dict):
        raise ValueError(f"rules must be a JSON object like {{\"rules\": {{\"age\": {{\"min\": 18}}}}, "
                         f"\"max_clients\": 1}}, not {type(rules).__name__}")
    unknown = sorted(set(rules) - set(KEYS))
    if unknown:
        raise ValueError(f"rules has unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(KEYS)}")
    columns = rules.get("rules")
    if not isinstance(columns, dict) or not columns:
        raise ValueError("rules needs \"rules\": an object naming at least one column, e.g. "
                         "{\"age\": {\"min\": 18, \"max\": 80}}")
    parsed = {}
    for name, spec in columns.items():
        if not name.strip():
            raise ValueError("rules names an empty column")
        if not isinstance(spec, dict):
            raise ValueError(f"the rule of column {name!r} must be an object with \"min\" and/or \"max\" "
                             f"(or {{}}), not {spec!r}")
        extra = sorted(set(spec) - set(BOUNDS))
        if extra:
            raise ValueError(f"the rule of column {name!r} has unknown key(s) {', '.join(map(repr, extra))}; "
                             "allowed: min, max")
        low, high = (_bound(name, key, spec.get(key)) for key in BOUNDS)
        if low is not None and high is not None and low > high:
            raise ValueError(f"the rule of column {name!r} has min {low} > max {high}: it keeps nothing")
        parsed[name] = (low, high)
    max_clients = _count(rules.get("max_clients", 1), "max_clients")
    min_group_size = _count(rules.get("min_group_size", 1), "min_group_size")
    privacy = _privacy(rules.get("privacy"))
    if privacy:
        unbounded = [name for name, (low, high) in parsed.items() if low is None or high is None]
        if unbounded:
            raise ValueError(f"\"privacy\" needs both min and max in every rule (they bound what one person can "
                             f"change, so calibrate the noise); column(s) {', '.join(map(repr, unbounded))} lack one")
    secure = rules.get("secure", False)
    if not isinstance(secure, bool):
        raise ValueError(f"secure must be true or false, not {secure!r}")
    if secure and max_clients < 2:
        raise ValueError("\"secure\": true needs max_clients >= 2: the sum over one provider is its own partial")
    return Rules(parsed, max_clients, min_group_size, privacy, secure)


def _privacy(spec: Any) -> Optional[Tuple[float, float]]:
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) - set(PRIVACY_KEYS) or "epsilon" not in spec:
        raise ValueError(f"privacy must be an object {{\"epsilon\": e, \"delta\": d}} (delta optional), not {spec!r}")
    epsilon, delta = spec["epsilon"], spec.get("delta", 0)
    for key, value in (("epsilon", epsilon), ("delta", delta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"privacy {key} must be a finite number, not {value!r}")
    if epsilon <= 0:
        raise ValueError(f"privacy epsilon must be > 0, not {epsilon!r}")
    if not 0 <= delta < 1:
        raise ValueError(f"privacy delta must be in [0, 1), not {delta!r}")
    return float(epsilon), float(delta)


def _bound(column: str, key: str, value: Any) -> Bound:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"the {key} of column {column!r} must be a finite number, not {value!r}")
    return value


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an integer >= 1, not {value!r}")
    return value
