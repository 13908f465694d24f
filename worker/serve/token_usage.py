"""A worker's side of the tokens' quotas and shares (ravop.store.quotas): before it runs a claimed subgraph, whether
the token may have it now (its worker time left, its subgraphs running under --max-workers); the worker time each
token's subgraphs take, added to the token's usage at most every FLUSH_SECONDS (one round trip for all tokens);
and a memory check before a subgraph's outputs are stored. A token's quota is read at most every QUOTA_SECONDS,
so that a worker pays no round trip per subgraph for it."""
import threading
import time
from typing import Dict, Optional, Tuple

from ravop.store import quotas
from ravop.store.client_types import Client
from ravop.store.keys import GraphKeys, usage_key

QUOTA_SECONDS = 2.0   # how stale a worker's copy of a token's quota may be
FLUSH_SECONDS = 1.0   # how often the worker time of plain subgraphs is added to the tokens' usage
PASS, REFUSE = "pass", "refuse"


class TokenUsage:
    def __init__(self, client: Client, name: str) -> None:
        self.client, self.name = client, name
        self._quotas: Dict[str, Tuple[float, quotas.Quota]] = {}
        self._lock = threading.Lock()   # the loop's look (worker/loops/turns.py) charges from the watch thread
        self._owed: Dict[str, float] = {}   # token -> worker seconds not yet added to its usage
        self._since: Optional[float] = None   # when the running subgraph's time was last charged
        self._running: Optional[str] = None   # its token, while its marker is in the token's usage
        self._flushed = time.monotonic()

    def quota(self, token: str) -> quotas.Quota:
        if self.quota_stale(token):
            self.note_quota(token, self.client.hgetall(quotas.quota_key(token)))
        return self._quotas[token][1]

    def quota_stale(self, token: str) -> bool:
        """Whether the token's quota must be read again (the claim reads it in its own round trip then)."""
        cached = self._quotas.get(token)
        return cached is None or cached[0] < time.monotonic()

    def note_quota(self, token: str, raw: dict) -> None:
        """Keep the token's quota hash as read (HGETALL) for QUOTA_SECONDS."""
        if len(self._quotas) > 1000:
            self._quotas.clear()
        self._quotas[token] = (time.monotonic() + QUOTA_SECONDS, quotas.decode(raw))

    def admit(self, keys: GraphKeys, subgraph_id: int) -> Optional[Tuple[str, str]]:
        """None if this worker may run the claimed subgraph now, and starts its clock; else (PASS, why): the token
        runs as many as --max-workers lets it (for later), or (REFUSE, why): its worker time is spent."""
        quota = self.quota(keys.token)
        if quota.max_worker_seconds is not None:
            used = quotas.worker_seconds(self.client.hgetall(usage_key(keys.token)))
            refusal = quotas.time_refusal(keys.token, used + self._owed.get(keys.token, 0.0), quota)
            if refusal is not None:
                return REFUSE, refusal
        if quota.max_workers is not None:
            others = {w for w in quotas.running(self.client, keys.token) if w != self.name}
            if len(others) >= quota.max_workers:
                return PASS, f"token {keys.token} runs {len(others)} subgraphs, its --max-workers quota"
            self.client.hset(usage_key(keys.token), quotas.RUNNING + self.name, f"{keys.graph_id}/{subgraph_id}")
            self._running = keys.token
        self._since = time.monotonic()
        return None

    def charge(self, token: str) -> float:
        """Add the running subgraph's time since the last charge to `token`'s usage now; its worker time in all."""
        with self._lock:
            self._take(token)
            owed = self._owed.pop(token, 0.0)
        return self.client.hincrbyfloat(usage_key(token), quotas.WORKER_SECONDS, owed)

    def _take(self, token: str) -> None:
        if self._since is not None:
            now = time.monotonic()
            self._owed[token] = self._owed.get(token, 0.0) + now - self._since
            self._since = now

    def done(self, token: str) -> None:
        """The subgraph ended (however): its time is owed, its running marker removed; owed time added if due."""
        with self._lock:
            self._take(token)
            self._since = None
            self._send(time.monotonic() - self._flushed >= FLUSH_SECONDS)

    def flush(self) -> None:
        """Add all the time owed (the worker is leaving)."""
        with self._lock:
            self._send(True)

    def _send(self, due: bool) -> None:
        running, self._running = self._running, None
        if not (due or running):
            return
        owed, self._owed = (self._owed, {}) if due else ({}, self._owed)
        pipe = self.client.pipeline(transaction=False)
        if running is not None:
            pipe.hdel(usage_key(running), quotas.RUNNING + self.name)
        for owing, seconds in owed.items():
            pipe.hincrbyfloat(usage_key(owing), quotas.WORKER_SECONDS, seconds)
        pipe.execute()
        if due:
            self._flushed = time.monotonic()

    def check_memory(self, token: str, adding: int, what: str) -> None:
        """QuotaError if storing `adding` bytes would take the token past its --max-memory."""
        quota = self.quota(token)
        if quota.max_memory is not None:
            quotas.check_memory(self.client, token, adding, what, quota)
