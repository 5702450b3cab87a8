"""The Felix control plane: tenants, catalog, signing keys, token exchange and RBAC.

Run it with ``felix-controlplane`` (:mod:`.cli`). Brokers follow it through
:mod:`.sync` (``LiveCatalog`` and ``TenantJwksVerifier``).
"""
