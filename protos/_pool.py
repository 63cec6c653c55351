"""The descriptor pool our generated protos register in (not protobuf's default pool; see tools/gen_protos.py)."""

from google.protobuf import descriptor_pool

PROTOS_POOL = descriptor_pool.DescriptorPool()
