"""The ONNX opset and IR version every model inferd writes (examples, tests) is pinned to: onnx's
defaults track its own newest, which an older onnxruntime may refuse to load."""

from __future__ import annotations

from typing import Final

OPSET: Final = 17
IR_VERSION: Final = 9
