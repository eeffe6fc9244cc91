#!/bin/sh
# The one way inferd is built and installed: the images (deploy/Dockerfile*) and CI
# (tests/integration/test_wheel_install.py, which `make test` runs) call this script, so a green CI
# means the images' install steps work.
#
#   deploy/install.sh wheel OUT_DIR            build the wheel into OUT_DIR (no dependencies)
#   deploy/install.sh install WHEEL [--gpu]    install it: CPU (ONNX Runtime from PyPI's onnxruntime)
#                                              or GPU (the gpu extra, with onnxruntime-gpu in place
#                                              of onnxruntime: both ship the `onnxruntime` module,
#                                              so they must never be installed together)
#
# PYTHON (default python3) is the interpreter whose environment gets the package. PIP_WHEEL_ARGS are
# added to `pip wheel` (CI: --no-build-isolation -C build-dir=... to reuse a build of the core).
set -eu
PYTHON=${PYTHON:-python3}
pip() { "$PYTHON" -m pip --disable-pip-version-check "$@"; }

usage() {
  sed -n '6,10p' "$0" >&2
  exit 2
}

[ $# -ge 2 ] || usage
command=$1
shift
case "$command" in
  wheel)
    out=$1
    root=$(cd "$(dirname "$0")/.." && pwd)
    # shellcheck disable=SC2086  # PIP_WHEEL_ARGS is a list of arguments
    pip wheel --no-deps --wheel-dir "$out" ${PIP_WHEEL_ARGS:-} "$root"
    ;;
  install)
    wheel=$1
    gpu=false
    [ "${2:-}" = "--gpu" ] && gpu=true
    if [ "$gpu" = true ]; then
      pip install --no-cache-dir "$wheel[gpu]"
      # The CPU runtime out first, then the GPU one: installing onnxruntime-gpu over onnxruntime
      # and removing onnxruntime afterwards would delete files the two share.
      pip uninstall --yes onnxruntime
      pip install --no-cache-dir "onnxruntime-gpu>=1.18"
    else
      pip install --no-cache-dir "$wheel"
    fi
    # The runtime must import, and the command run, in the environment just made.
    "$PYTHON" -c "import onnxruntime; print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"
    "$PYTHON" -m inferd --version
    ;;
  *) usage ;;
esac
