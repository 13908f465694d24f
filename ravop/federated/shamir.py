"""Shamir's secret sharing (1979) over the field of Curve25519's prime, 2^255 - 19: a secret below it (a 32-byte
seed drawn so) becomes n shares, any t of which give it back by Lagrange interpolation at 0, while fewer say
nothing of it. Shares are the polynomial's values at x = 1..n, one 32-byte residue each. No well-kept Python
library shares 32-byte secrets over a prime field (PyCryptodome's Shamir takes 16 bytes over GF(2^128)), and
the arithmetic is Python's exact integers."""
import secrets
from typing import Dict, List, Mapping

PRIME = (1 << 255) - 19
SIZE = 32   # bytes of a secret or a share


def random_secret() -> int:
    """A uniformly random secret of the field (a seed, or an X25519 private key's bytes)."""
    return secrets.randbelow(PRIME)


def split(secret: int, n: int, t: int) -> Dict[int, int]:
    """{x: share} for x = 1..n of a random polynomial of degree t - 1 whose value at 0 is `secret`."""
    if not 1 <= t <= n or not 0 <= secret < PRIME:
        raise ValueError(f"Shamir sharing needs 1 <= t <= n and a secret of the field: t={t}, n={n}")
    coefficients: List[int] = [secret] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    shares = {}
    for x in range(1, n + 1):
        value = 0
        for c in reversed(coefficients):   # Horner
            value = (value * x + c) % PRIME
        shares[x] = value
    return shares


def combine(shares: Mapping[int, int]) -> int:
    """The value at 0 of the polynomial through `shares` ({x: share}); the secret if they are t or more honest
    shares of it (a tampered one gives another value, which the caller checks against a commitment)."""
    if not shares or len(set(shares)) != len(shares) or any(not 0 < x < PRIME for x in shares):
        raise ValueError(f"Shamir shares need distinct nonzero x: {sorted(shares)}")
    secret = 0
    for x, y in shares.items():
        numerator, denominator = 1, 1
        for other in shares:
            if other != x:
                numerator = numerator * -other % PRIME
                denominator = denominator * (x - other) % PRIME
        secret = (secret + y * numerator * pow(denominator, -1, PRIME)) % PRIME
    return secret
