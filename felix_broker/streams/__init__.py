"""Streams: the shard engine (publish queues, fanout) and a subscription's delivery."""
