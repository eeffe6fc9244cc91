"""inferd: a gRPC inference server for the KServe v2 / Triton protocol, with a C++ batching core."""

__version__ = "0.1.0"

__all__ = ["__version__"]
