"""What the broker and the control plane share, so that neither imports the other.

=====================  ==============================================================
``tokens``             Felix tokens: signing (``DevIssuer``), verification
                       (``TokenVerifier``), the public JWK of a key (``public_jwk``)
``permissions``        grants, actions and permission objects
``catalog``            the resource model: ``StreamSpec``, ``CacheSpec``, ``Routing``,
                       the name alphabet and the limits
``feed``               the catalog sync feed between them: the JSON of a stream or
                       cache definition and the snapshot and change pages
``http``               the one HTTP server stack (aiohttp) both listen with, and a
                       bounded body reader for their aiohttp clients
``safejson``           JSON from strangers, nesting depth bounded before decoding
``files``              secret files created once, replaced atomically, mode-checked
=====================  ==============================================================

Nothing here imports the broker, the control plane, the client or the kit (an
import contract in ``pyproject.toml`` says so).
"""
