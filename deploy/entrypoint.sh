#!/bin/sh
# The images' entrypoint: `inferd serve` with the container's arguments (the Dockerfiles' CMD, or a
# manifest's args). A first argument `tritonserver` is dropped first: a command line written for
# Triton's image names Triton's program before its flags (KServe's kserve-tritonserver runtime
# passes `tritonserver --model-store=/mnt/models ...` as its args), and inferd takes those flags, so
# such a runtime starts inferd once its image is swapped.
set -eu
if [ "${1:-}" = tritonserver ]; then
  shift
fi
exec inferd serve "$@"
