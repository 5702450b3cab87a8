"""Discovery: how many shards a stream or cache has, and who owns them."""
