"""The types the store's functions take: a connected client (`redis.Redis` of a standalone server or
`redis.cluster.RedisCluster`, `ravop.store.connect`) and a pipeline of one. They are `Any` to mypy: redis-py
types every reply as `bytes | str | ...` since it cannot know that our clients never decode responses (replies
are bytes), so its types would call for a cast at each read; the checks are about our own types around them."""
from typing import Any, Union

Client = Any     # redis.Redis | redis.cluster.RedisCluster
Pipeline = Any   # redis.client.Pipeline | redis.cluster.ClusterPipeline
MessageId = Union[bytes, str]   # a stream entry's id: bytes as our clients read it, str where code writes one
