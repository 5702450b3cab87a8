"""Replication of a shard's log over its replica set (leader and followers).

`core` is the sans-IO state machine: one `Replica` per broker per shard, fed
client appends, peer messages, fsync completions, lease signals and the time,
and returning peer messages, disk writes and client outcomes. Nothing here opens
a socket, reads a clock or touches a file; the fleet's adapters do (the broker to
broker channel, the durable log, etcd leases), so the same core runs unchanged in
the model-checking tests (tests/replication/).
"""
