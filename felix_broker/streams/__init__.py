"""Streams: the publish/subscribe/read service, the shard engine (publish queues,
fanout), a subscription's delivery, the publish byte budgets, and the guarded writes
(idempotent producers, conditional publishes, atomic commits, publish widths)."""
