"""What of a runtime's error message a client may read.

ONNX Runtime writes where in its source a check failed into its messages
("/onnxruntime_src/.../reshape_helper.h:91 onnxruntime::ReshapeHelper::ReshapeHelper(...) "):
that tells clients about the server's build, not about their request, so the executors answer
without it and log the full text. The core's native executor does the same
(``without_source_locations`` in cpp/src/onnxruntime_executor.cpp); the two are tested on the
same message.
"""

from __future__ import annotations

import re

# A whitespace-delimited "<path>.<source extension>:<line>" token, the spaces after it and the
# C++ function ORT names after it ("ns::Class::f(args)", one level of nested parentheses).
_SOURCE_LOCATION = re.compile(
    r"(?<!\S)\S*\.(?:cc|cpp|cxx|c|h|hpp|cu|cuh|inl):\d+(?!\S)\s*"
    r"(?:[\w:~<>,]+\((?:[^()]|\([^()]*\))*\)\s*)?"
)


def without_source_locations(message: str) -> str:
    """``message`` without the source locations (and functions) a runtime wrote into it."""
    return _SOURCE_LOCATION.sub("", message).rstrip()
