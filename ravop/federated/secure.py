"""Secure aggregation (`"secure": true` in the rules): providers mask their partials with pairwise masks, so
that the store and the requester can read only their sum (Bonawitz et al. 2017, arXiv 1611.04482, without its
dropout recovery).

A partial becomes a vector of sums that add up over providers: per rule column its count, the sum and the sum of
squares of (v - c) (c: the middle of the rule's range, or 0, which keeps the squares small), and each histogram's
bin counts. Each sum is fixed-point (2^-32 units) modulo 2^128, each count an integer modulo 2^64 (under
privacy, the noisy count rounded). Every provider that joined draws an X25519 key
pair and writes its public key to the graph; once all `max_clients` keys are there, provider i agrees a secret
with each other provider j, expands it (HKDF-SHA256 bound to the graph and the pair, then a ChaCha20 stream) to a
mask m_ij of the vector's length, and writes x_i + sum_{j > i} m_ij - sum_{j < i} m_ij. The masks cancel in the
sum over all providers and nowhere else: a single masked vector is uniformly random to whoever lacks the
secrets.

Each provider also adds a self-mask (a ChaCha20 stream of a seed of its own), and Shamir-shares both the
seed and its masking key among the others before anyone masks, so that providers may drop out after that and
the survivors' sum is still released (`ravop.federated.recovery`: SecAgg+).

Public keys are pinned (issue 44: HSET on a graph's `public_keys` is granted to every worker user, whose
rewrite of one key let it read that provider's sums): each provider's contribution names (by digest) the public
key it published and the keys it masked with, and the release (`check_keys`) refuses, naming the provider, a key that
some provider masked with and its owner never published. A released aggregate is checked for consistency first
(`check_sums`): a count in [0, 2^48] and, for a closed range without privacy noise, sums that values in the range
can give; masks that did not cancel give uniformly random residues, which fail these with overwhelming odds.
"""
import base64
import binascii
import hashlib
from typing import List, Mapping, Optional, Sequence

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

WIDE, NARROW = "w", "n"     # the kinds of element: a fixed-point sum, or a count
WIDTH = {WIDE: 16, NARROW: 8}        # bytes: sums modulo 2^128, counts modulo 2^64 (exact integers)
MODULUS = {kind: 1 << (8 * width) for kind, width in WIDTH.items()}
SCALE = {WIDE: 1 << 32, NARROW: 1}   # a sum is written in units of 2^-32, a count in units


def kinds(n_columns: int, histogram_bins: Sequence[int]) -> str:
    """The kind of each element of a vector: per column its count, sum and sum of squares, then each
    histogram's bins."""
    return (NARROW + WIDE + WIDE + NARROW * sum(histogram_bins)) * n_columns


def encode(values: Sequence[float], layout: str) -> List[int]:
    """Fixed-point residues of the sums and counts (negative ones wrap around)."""
    return [round(float(v) * SCALE[kind]) % MODULUS[kind] for v, kind in zip(values, layout, strict=True)]


def decode(residues: Sequence[int], layout: str) -> List[float]:
    """Sums of residues added modulo their ring, back to floats (the upper half of a ring is negative)."""
    return [(r - MODULUS[kind] if r >= MODULUS[kind] // 2 else r) / SCALE[kind]
            for r, kind in zip(residues, layout, strict=True)]


def pack(residues: Sequence[int], layout: str) -> str:
    return base64.b64encode(b"".join(r.to_bytes(WIDTH[kind], "little")
                                     for r, kind in zip(residues, layout, strict=True))).decode()


def unpack(encoded: object, layout: str) -> List[int]:
    """A masked vector laid out as `layout`; ValueError if it is not one."""
    if not isinstance(encoded, str):
        raise ValueError(f"a masked partial must be a base64 string, not {type(encoded).__name__}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise ValueError("a masked partial is not base64") from None
    size = sum(WIDTH[kind] for kind in layout)
    if len(raw) != size:
        raise ValueError(f"a masked partial holds {len(raw)} bytes, not {size}")
    return _split(raw, layout)


def _split(raw: bytes, layout: str) -> List[int]:
    values, at = [], 0
    for kind in layout:
        values.append(int.from_bytes(raw[at:at + WIDTH[kind]], "little"))
        at += WIDTH[kind]
    return values


def add(vectors: Sequence[Sequence[int]], layout: str) -> List[int]:
    return [sum(column) % MODULUS[kind] for column, kind in zip(zip(*vectors), layout)]


class MaskingKey:
    """One provider's X25519 key pair for one graph; `secret`: its private key as an integer below 2^255 - 19
    (what the provider Shamir-shares, and what the aggregator rebuilds if it drops out)."""

    def __init__(self, secret: Optional[int] = None) -> None:
        self._private = (X25519PrivateKey.generate() if secret is None
                         else X25519PrivateKey.from_private_bytes(secret.to_bytes(32, "little")))

    def public(self) -> str:
        raw = self._private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def mask(self, residues: Sequence[int], layout: str, me: str, publics: Mapping[str, str],
             context: str) -> List[int]:
        """`residues` plus this provider's masks with every other provider in `publics` (name -> public key)."""
        masked = list(residues)
        for other, public in sorted(publics.items()):
            if other == me:
                continue
            stream = self.pair_mask(me, other, public, layout, context)
            sign = 1 if me < other else -1
            masked = [(m + sign * s) % MODULUS[kind] for m, s, kind in zip(masked, stream, layout)]
        return masked

    def pair_mask(self, me: str, other: str, public: str, layout: str, context: str) -> List[int]:
        """The mask this provider (`me`) shares with `other` (whose public key is `public`)."""
        first, second = sorted((me, other))
        return mask_stream(self._private.exchange(_public_key(other, public)), layout,
                           "ravop-secure-aggregation", context, first, second)


def _public_key(name: str, encoded: str) -> X25519PublicKey:
    try:
        return X25519PublicKey.from_public_bytes(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        raise ValueError(f"provider {name}'s public key is not an X25519 key") from None


def mask_stream(secret: bytes, layout: str, *purpose: str) -> List[int]:
    """A mask of `layout` expanded from `secret` (a pair's agreed secret, or a provider's own seed), another for
    every `purpose` (the graph and the names, in an order both ends of a pair share)."""
    info = hashlib.sha256("\0".join(purpose).encode()).digest()
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)
    cipher = Cipher(algorithms.ChaCha20(key, b"\0" * 16), mode=None).encryptor()
    return _split(cipher.update(bytes(sum(WIDTH[kind] for kind in layout))), layout)


MAX_COUNT = 1 << 48   # more rows than any provider holds; a garbage count is uniform over 2^64


class TamperedAggregate(ValueError):
    """A secure graph's partials do not add up to an aggregate its providers could have sent."""


def key_digest(public: str) -> str:
    """What a contribution names a public key by: 128 bits of its SHA-256, in base64 (22 characters)."""
    return base64.b64encode(hashlib.sha256(public.encode()).digest()[:16]).decode().rstrip("=")


def check_keys(contributions: Mapping[str, Mapping[str, object]]) -> None:
    """TamperedAggregate naming the provider whose public key some provider masked with though it published
    another (its key rewritten in the store after it registered); keys are named by their `key_digest`."""
    published = {name: c.get("public") for name, c in contributions.items()}
    for name, contribution in sorted(contributions.items()):
        used = contribution.get("keys")
        if not isinstance(used, dict) or not isinstance(published[name], str):
            raise TamperedAggregate(f"provider {name}'s contribution does not name the public keys it used")
        for owner, key in sorted(used.items()):
            if owner in published and key != published[owner]:
                raise TamperedAggregate(f"the public key of provider {owner} was rewritten after it registered: "
                                        f"provider {name} masked with a key {owner} never published; the query "
                                        "is refused (docs/operators/security.md)")


def check_sums(column: str, count: float, shifted: float, squares: float, half: Optional[float],
               noisy: bool) -> None:
    """TamperedAggregate unless a column's summed count, sum and sum of squares (of values less the range's
    centre; `half`: half the range's width, None for an open one) are what values in the range could give."""
    slack = 1e-9
    why = ""
    if not (-MAX_COUNT if noisy else 0) <= count <= MAX_COUNT:
        why = f"count {count:.6g} is outside [0, 2^48]"
    elif half is not None and not noisy and (abs(shifted) > count * half * (1 + slack) + 1e-6 or
                                             not 0 <= squares <= count * half * half * (1 + slack) + 1e-6):
        why = f"its sums (mean {shifted / count if count else 0:.6g} from the centre) are outside the column's range"
    if why:
        raise TamperedAggregate(f"the secure aggregate of column {column!r} is not consistent: {why}; a partial or "
                                "public key was rewritten or masks did not cancel (docs/operators/security.md)")


def centre(low: Optional[float], high: Optional[float]) -> float:
    """The reference point of a column's sums: the middle of its rule's range, or 0 if a bound is open."""
    return (low + high) / 2 if low is not None and high is not None else 0.0
