"""Secure aggregation (`"secure": true` in the rules): providers mask their partials with pairwise masks, so
that the store and the requester can read only their sum (Bonawitz et al. 2017, arXiv 1611.04482, without its
dropout recovery).

A partial becomes a vector of sums that add up over providers: per rule column its count, the sum and the sum of
squares of (v - c) (c: the middle of the rule's range, or 0, which keeps the squares small), and each histogram's
bin counts. Each sum is fixed-point (2^-32 units) modulo 2^128. Every provider that joined draws an X25519 key
pair and writes its public key to the graph; once all `max_clients` keys are there, provider i agrees a secret
with each other provider j, expands it (HKDF-SHA256 bound to the graph and the pair, then a ChaCha20 stream) to a
mask m_ij of the vector's length, and writes x_i + sum_{j > i} m_ij - sum_{j < i} m_ij. The masks cancel in the
sum over all providers and nowhere else: a single masked vector is uniformly random to whoever lacks the
secrets.

A provider that stops after the keys are exchanged leaves masks that nothing cancels: the query cannot be
answered, and R.track_progress names the provider (the graph waits for it; its timeout= gives up). There is no
recovery through secret shares. The public keys are trusted as the store gives them (an honest-but-curious
store: one that rewrote them could read the partials).
"""
import base64
import binascii
import hashlib
from typing import Dict, List, Mapping, Sequence

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

BITS = 128
MODULUS = 1 << BITS
WIDTH = BITS // 8           # bytes per element of a masked vector
SCALE = 1 << 32             # fixed point: a sum is written in units of 2^-32


def encode(values: Sequence[float]) -> List[int]:
    """Fixed-point residues of the sums (negative ones wrap around)."""
    return [round(float(v) * SCALE) % MODULUS for v in values]


def decode(residues: Sequence[int]) -> List[float]:
    """The sums of residues added modulo 2^128, back to floats (the upper half of the ring is negative)."""
    return [(r - MODULUS if r >= MODULUS // 2 else r) / SCALE for r in residues]


def pack(residues: Sequence[int]) -> str:
    return base64.b64encode(b"".join(r.to_bytes(WIDTH, "little") for r in residues)).decode()


def unpack(encoded: object, length: int) -> List[int]:
    """A masked vector of `length` elements; ValueError if it is not one."""
    if not isinstance(encoded, str):
        raise ValueError(f"a masked partial must be a base64 string, not {type(encoded).__name__}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise ValueError("a masked partial is not base64") from None
    if len(raw) != length * WIDTH:
        raise ValueError(f"a masked partial holds {len(raw)} bytes, not {length * WIDTH}")
    return [int.from_bytes(raw[i:i + WIDTH], "little") for i in range(0, len(raw), WIDTH)]


def add(vectors: Sequence[Sequence[int]]) -> List[int]:
    return [sum(column) % MODULUS for column in zip(*vectors)]


class MaskingKey:
    """One provider's X25519 key pair for one graph."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()

    def public(self) -> str:
        raw = self._private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def mask(self, residues: Sequence[int], me: str, publics: Mapping[str, str], context: str) -> List[int]:
        """`residues` plus this provider's masks with every other provider in `publics` (name -> public key)."""
        masked = list(residues)
        for other, public in sorted(publics.items()):
            if other == me:
                continue
            stream = _mask_stream(self._private.exchange(_public_key(other, public)), context, me, other,
                                  len(residues))
            sign = 1 if me < other else -1
            masked = [(m + sign * s) % MODULUS for m, s in zip(masked, stream)]
        return masked


def _public_key(name: str, encoded: str) -> X25519PublicKey:
    try:
        return X25519PublicKey.from_public_bytes(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        raise ValueError(f"provider {name}'s public key is not an X25519 key") from None


def _mask_stream(shared: bytes, context: str, me: str, other: str, length: int) -> List[int]:
    """The pair's mask: the same for both ends (the names are ordered), another for every graph."""
    first, second = sorted((me, other))
    info = hashlib.sha256("\0".join(("ravop-secure-aggregation", context, first, second)).encode()).digest()
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)
    cipher = Cipher(algorithms.ChaCha20(key, b"\0" * 16), mode=None).encryptor()
    raw = cipher.update(b"\0" * (length * WIDTH))
    return [int.from_bytes(raw[i:i + WIDTH], "little") for i in range(0, len(raw), WIDTH)]


def centre(low, high) -> float:
    """The reference point of a column's sums: the middle of its rule's range, or 0 if a bound is open."""
    return (low + high) / 2 if low is not None and high is not None else 0.0


def layout(columns: Mapping[str, tuple], histogram_bins: Sequence[int]) -> Dict[str, int]:
    """{column: offset} of each column's sums in a vector: 3 moments, then each histogram's bins."""
    width = 3 + sum(histogram_bins)
    return {column: i * width for i, column in enumerate(columns)}
