"""Which nodes a Redis Cluster has lost for good: primaries the cluster itself marked failed (`fail`, agreed by
a majority after cluster-node-timeout, not a blip) that still own slots, so no replica took their place. While
one is lost, every graph whose keys, or the work streams, live in its slots cannot go on; a requester is told
which node, instead of waiting on a cluster that cannot answer."""
from typing import Any, Dict, Iterable, List

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from .client_types import Client


def lost_primaries(client: Client) -> List[str]:
    """'host:port (slots a-b, ...)' of each failed primary no replica has replaced; [] on a healthy cluster, a
    standalone server, or when no node answers."""
    if not isinstance(client, RedisCluster):
        return []
    for node in client.get_nodes():
        try:
            nodes = client.get_redis_connection(node).cluster("nodes")
        except (redis.RedisError, RedisClusterException, OSError):
            continue
        return [f"{address} (slots {', '.join('-'.join(map(str, r)) for r in info['slots'])})"
                for address, info in sorted(nodes.items()) if _lost(info, nodes.values())]
    return []


def _lost(info: Dict[str, Any], nodes: Iterable[Dict[str, Any]]) -> bool:
    """Whether the node of `info` (redis-py's parse of a CLUSTER NODES line) is a failed primary holding slots
    that no live replica of it can take over."""
    flags = info["flags"].split(",")
    if "master" not in flags or "fail" not in flags or not info["slots"]:
        return False
    return not any(other["master_id"] == info["node_id"] and "fail" not in other["flags"].split(",")
                   and "fail?" not in other["flags"].split(",") for other in nodes)
