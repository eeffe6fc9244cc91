"""Compile proto/*.proto to Python modules for the package ``inferd._proto``.

Run by the CMake build: ``python compile_python.py OUT_DIR FILE.proto...``.

Two rewrites follow protoc, both so that inferd can live in one process with tritonclient, whose
generated modules define the same ``inference.*`` symbols in protobuf's default descriptor pool:
- the files register into inferd's private pool (``inferd._proto.POOL``) instead of the default one;
- imports between the generated modules become package-relative.
"""

from __future__ import annotations

import pathlib
import re
import sys

from grpc_tools import protoc


def main(argv: list[str]) -> int:
    out = pathlib.Path(argv[1])
    protos = [pathlib.Path(p) for p in argv[2:]]
    out.mkdir(parents=True, exist_ok=True)
    include = {str(p.parent) for p in protos}
    args = [
        "protoc",
        *(f"-I{d}" for d in include),
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(p) for p in protos),
    ]
    if protoc.main(args) != 0:
        print("protoc failed", file=sys.stderr)
        return 1
    for path in out.glob("*_pb2*.py*"):
        text = path.read_text()
        text = re.sub(r"^import (\w+_pb2) as ", r"from . import \1 as ", text, flags=re.M)
        text = text.replace("_descriptor_pool.Default()", "_inferd_pool")
        if "_inferd_pool" in text:
            text = text.replace(
                "from google.protobuf import descriptor_pool as _descriptor_pool\n",
                "from google.protobuf import descriptor_pool as _descriptor_pool\n"
                "from . import POOL as _inferd_pool\n",
                1,
            )
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
