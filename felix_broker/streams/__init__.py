"""Streams: the publish/subscribe/read service, the shard engine (publish queues,
fanout), a subscription's delivery, and the publish byte budgets."""
