"""Dropout recovery for secure aggregation (SecAgg+: Bonawitz et al. 2017, arXiv 1611.04482, section 4; Flower's
secaggplus): providers may drop out after the masks are set up and the sum of the survivors is still released,
as long as at least t = n - floor(n/3) of the n = `max_clients` providers survive (up to a third may drop).

Each provider holds a masking key (X25519, whose pairwise masks `ravop.federated.secure` adds), a second X25519
key that only encrypts shares, and a self-mask seed b. It publishes both public keys; once all n are in, it
Shamir-shares (t of n, `ravop.federated.shamir`) the masking key's secret and b, and sends each other provider
its two shares encrypted (ChaCha20-Poly1305 under a key agreed between the two share keys and bound to the graph
and the ordered pair, so nobody else reads or forges them). Once all n sent shares, each masks with every other
and with its own b, and writes the masked sums with a commitment to b (SHA-256 of the graph, its name and b).
When the inputs close (all in, or the missing ones' processes gone), each survivor reveals, from the shares it
received, the seed shares of the survivors and the masking-key shares of the dropped, never both of one
provider; the aggregator rebuilds each survivor's b (checked against its commitment) and each dropped provider's
masking key (checked against its published key) and removes their masks.

Why a self-mask: a provider declared dropped that was only slow may still send its masked sums after its
masking key was rebuilt; without b, whoever watches the store would then read its sums in the clear. With b, one
provider's sums are exposed only if t providers reveal both of its secrets, which no honest one does.
"""
import base64
import binascii
import hashlib
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import secure, shamir

SEED = "seed"   # a reveal's shares of survivors' self-mask seeds
KEY = "key"     # and of dropped providers' masking keys


def threshold(n: int) -> int:
    """How many providers must survive, and reveal, for the sum to be released: up to a third may drop."""
    return n - n // 3


class ShareError(ValueError):
    """A share that does not decrypt under the keys its sender and recipient published (rewritten in the store)."""


def split_public(name: str, public: str) -> Tuple[str, str]:
    """(masking key, share key) of a provider's published public key, "<masking key>:<share key>" in base64."""
    parts = public.split(":") if isinstance(public, str) else []
    if len(parts) != 2:
        raise ValueError(f"provider {name}'s public key is not a masking key and a share key")
    return parts[0], parts[1]


def _b64(value: int) -> str:
    return base64.b64encode(value.to_bytes(shamir.SIZE, "little")).decode()


def _int(encoded: object, what: str) -> int:
    try:
        raw = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else b""
    except binascii.Error:
        raw = b""
    if len(raw) != shamir.SIZE:
        raise ValueError(f"{what} is not a {shamir.SIZE}-byte base64 share")
    return int.from_bytes(raw, "little")


def seed_mask(seed: int, layout: str, me: str, context: str) -> List[int]:
    """A provider's self-mask: what its sums carry until t survivors reveal shares of its seed."""
    return secure.mask_stream(seed.to_bytes(shamir.SIZE, "little"), layout, "ravop-self-mask", context, me)


def commitment(seed: int, me: str, context: str) -> str:
    """What a provider's contribution names its seed by, so that a seed rebuilt from rewritten shares is caught
    (the seed is 255 random bits: the digest does not give it away)."""
    return hashlib.sha256("\0".join(("ravop-self-mask-seed", context, me, str(seed))).encode()).hexdigest()


class ProviderSecrets:
    """One provider's keys and seed for one secure graph, and its side of each round."""

    def __init__(self) -> None:
        self.key_secret = shamir.random_secret()
        self.masking = secure.MaskingKey(self.key_secret)
        self._share_key = X25519PrivateKey.generate()
        self.seed = shamir.random_secret()
        self._own: Dict[str, int] = {}   # this provider's own shares of its two secrets (never sent)

    def public(self) -> str:
        share = self._share_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return f"{self.masking.public()}:{base64.b64encode(share).decode()}"

    def _cipher(self, sender: str, recipient: str, other: str, public: str,
                context: str) -> Tuple[ChaCha20Poly1305, bytes]:
        """The AEAD of the pair's shares in one direction, and its associated data (the graph and the names);
        `public`: the other end's (`other`'s) published key."""
        encoded = split_public(other, public)[1]
        try:
            their = X25519PublicKey.from_public_bytes(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            raise ValueError(f"provider {other}'s share key is not an X25519 key") from None
        bound = "\0".join(("ravop-secagg-shares", context, sender, recipient)).encode()
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=hashlib.sha256(bound).digest()
                   ).derive(self._share_key.exchange(their))
        return ChaCha20Poly1305(key), bound

    def shares(self, me: str, publics: Mapping[str, str], context: str) -> Dict[str, str]:
        """{other provider: its shares of this provider's masking key and seed, encrypted to it} (t of n, the
        providers in name order at x = 1..n); this provider's own shares stay here."""
        names = sorted(publics)
        t = threshold(len(names))
        key_shares = shamir.split(self.key_secret, len(names), t)
        seed_shares = shamir.split(self.seed, len(names), t)
        sent = {}
        for x, name in enumerate(names, 1):
            if name == me:
                self._own = {KEY: key_shares[x], SEED: seed_shares[x]}
                continue
            cipher, bound = self._cipher(me, name, name, publics[name], context)
            plain = key_shares[x].to_bytes(shamir.SIZE, "little") + seed_shares[x].to_bytes(shamir.SIZE, "little")
            sent[name] = base64.b64encode(cipher.encrypt(b"\0" * 12, plain, bound)).decode()
        return sent

    def masked(self, residues: Sequence[int], layout: str, me: str, publics: Mapping[str, str],
               context: str) -> List[int]:
        """`residues` plus the pairwise masks with every other provider in `publics` and this one's self-mask."""
        pairwise = self.masking.mask(residues, layout, me, {name: split_public(name, public)[0]
                                                            for name, public in publics.items()}, context)
        return secure.add([pairwise, seed_mask(self.seed, layout, me, context)], layout)

    def reveal(self, me: str, publics: Mapping[str, str], received: Mapping[str, Mapping[str, str]],
               survivors: Sequence[str], context: str) -> Dict[str, Dict[str, str]]:
        """{SEED: {survivor: share of its seed}, KEY: {dropped: share of its masking key}} from `received`
        ({sender: {recipient: encrypted shares}}): one secret of each provider, never both."""
        revealed: Dict[str, Dict[str, str]] = {SEED: {}, KEY: {}}
        for sender in sorted(publics):
            kind = SEED if sender in survivors else KEY
            if sender == me:
                revealed[kind][sender] = _b64(self._own[kind])
                continue
            cipher, bound = self._cipher(sender, me, sender, publics[sender], context)
            try:
                plain = cipher.decrypt(b"\0" * 12, base64.b64decode(received[sender][me], validate=True), bound)
            except (KeyError, TypeError, binascii.Error, InvalidTag):
                raise ShareError(f"the shares provider {sender} sent to provider {me} do not decrypt under their "
                                 "published keys: rewritten in the store; the query is refused "
                                 "(docs/operators/security.md)") from None
            share = plain[:shamir.SIZE] if kind == KEY else plain[shamir.SIZE:]
            revealed[kind][sender] = base64.b64encode(share).decode()
        return revealed


def remove_masks(total: List[int], layout: str, contributions: Mapping[str, Mapping[str, Any]],
                 publics: Mapping[str, str], reveals: Mapping[str, Mapping[str, Mapping[str, str]]],
                 context: str) -> List[int]:
    """The survivors' sum: `total` (their masked vectors added) less their self-masks and their pairwise masks
    with the dropped providers, rebuilt from the survivors' `reveals` (`publics`: the graph's public keys).
    TamperedAggregate if a public key is not the one the survivors masked with (`secure.check_keys`: they all
    used the same), or a rebuilt secret not the one its provider committed to or published; ValueError if fewer
    than t revealed."""
    used = next(iter(contributions.values()))["keys"]
    names = sorted(used)
    for name in names:
        if name not in publics or secure.key_digest(publics[name]) != used[name]:
            raise secure.TamperedAggregate(f"the public key of provider {name} in the store is not the one the "
                                           "providers masked with: rewritten after they did")
    x_of = {name: x for x, name in enumerate(names, 1)}
    t = threshold(len(names))
    revealers = sorted(name for name in reveals if name in contributions)
    if len(revealers) < t:
        raise ValueError(f"{len(revealers)} of the {len(contributions)} surviving providers revealed their shares, "
                         f"fewer than the threshold t={t} of {len(names)}")

    def rebuilt(kind: str, owner: str) -> int:
        shares = {}
        for v in revealers:
            entries = reveals[v].get(kind) if isinstance(reveals[v], dict) else None
            shares[x_of[v]] = _int(entries.get(owner) if isinstance(entries, dict) else None,
                                   f"provider {v}'s share of provider {owner}'s {kind}")
        return shamir.combine(shares)

    for owner in sorted(contributions):
        seed = rebuilt(SEED, owner)
        if commitment(seed, owner, context) != contributions[owner].get("seed"):
            raise secure.TamperedAggregate(f"the self-mask seed of provider {owner} rebuilt from the revealed shares "
                                           "is not the one it committed to: a share or partial was rewritten")
        total = secure.add([total, [-v for v in seed_mask(seed, layout, owner, context)]], layout)
    for dropped in sorted(set(names) - set(contributions)):
        key = secure.MaskingKey(rebuilt(KEY, dropped))
        if key.public() != split_public(dropped, publics[dropped])[0]:
            raise secure.TamperedAggregate(f"the masking key of dropped provider {dropped} rebuilt from the revealed "
                                           "shares is not the one it published: a share was rewritten")
        for survivor in sorted(contributions):
            mask = key.pair_mask(dropped, survivor, split_public(survivor, publics[survivor])[0], layout, context)
            sign = -1 if survivor < dropped else 1   # what the survivor added, taken away
            total = secure.add([total, [sign * m for m in mask]], layout)
    return total
