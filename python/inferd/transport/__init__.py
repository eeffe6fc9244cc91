"""The gRPC transport: KServe v2 / Triton protocol servicer, message codec and status mapping.

Protocol messages do not leave this package; it speaks to the rest through ``inferd.dataplane``.
"""
