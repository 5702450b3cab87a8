"""The fleet: a broker's view of the other brokers and of who leads which shard.

Only a broker started with FELIX_NODE_ID (and FELIX_ETCD_ENDPOINTS) joins a
fleet; a standalone broker never imports what talks to etcd.
"""
