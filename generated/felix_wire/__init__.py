# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""felix_wire: the Felix wire protocol v1, generated from the catalogue.

Modules (one concern each):
  frame       - the 12-byte header, limits, and the incremental FrameReader
  flags       - frame flag bits and `layout_of(flags)`, the check every receiver runs
  features    - feature bits, the extended-word rules, Capabilities
  messages    - every JSON message as a msgspec Struct; encode/decode
  binary      - every binary layout: Structs and straight-line codecs
  codec       - decode_payload / encode_frame over both
  gating      - which peer must have announced what; shape_for_peer; auth negotiation
  errors      - error codes, retry classes, one BrokerError subclass per code
  wire_errors - typed local decode/encode errors
  routing     - routing keys to shards
  names       - the one rule for tenant, namespace, stream, cache and group names
  catalogue   - read-only index of everything above
  requirements - the protocol's requirements (spec/requirements.yaml), by id
  strategies  - hypothesis strategies (tests only)
"""

from .codec import Decoded, decode_frame, decode_payload, encode_frame
from .frame import Frame, FrameReader

__all__ = ["Decoded", "Frame", "FrameReader", "decode_frame", "decode_payload", "encode_frame"]
