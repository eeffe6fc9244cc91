"""Protocol and model-config messages, generated at build time from proto/ (see compile_python.py).

They register into POOL, a descriptor pool of inferd's own, not protobuf's default pool:
tritonclient defines the same ``inference.*`` names there, and both must be importable in one
process.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
