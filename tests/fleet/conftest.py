"""Fleet tests run against a real etcd (tests/support/etcd.py)."""

from tests.support.etcd import etcd_server

__all__ = ["etcd_server"]
