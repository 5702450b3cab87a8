"""The key-value cache: the request service, shards, their stored records and watches."""
