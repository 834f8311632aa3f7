#!/bin/sh
# The tritonserver of the `triton` profile: generate the Triton repository for the tierserve
# models in /models (the same folder the tierserve service serves), then serve it in poll mode.
# Every 30 s the generator runs again, so a version copied into /models/<model>/<N>/ gets its
# Triton version folder and tritonserver loads it (the old version serves until it is ready).
#
#   tierserve triton-repo --model-repository /models --ps-json /etc/tierserve/triton-ps.json \
#       --out /triton-models --site-packages '' --copy
#   tritonserver --model-repository=/triton-models --model-control-mode=poll \
#       --repository-poll-secs=30 --http-port=8000 --grpc-port=8001 --metrics-port=8002
#
# --ps-json: Triton's own ps.json (deploy/triton/ps.json): the tierserve service holds the
# RocksDB tier open for writing, and Triton runs each model version in a process of its own,
# so Triton's models read the shared Redis Cluster and apply Kafka updates without RocksDB.
# --site-packages '': tierserve is installed in the image's Python (deploy/triton/Dockerfile).
# --copy: files are copied, so /models may be read-only and change without breaking a version.
set -eu
MODELS=${MODELS:-/models}
PS_JSON=${PS_JSON:-/etc/tierserve/triton-ps.json}
OUT=${OUT:-/triton-models}
generate() {
    tierserve triton-repo --model-repository "$MODELS" --ps-json "$PS_JSON" --out "$OUT" \
        --site-packages '' --copy
}
generate
(while sleep 30; do generate >/dev/null || true; done) &
exec tritonserver --model-repository="$OUT" --model-control-mode=poll --repository-poll-secs=30 \
    --http-port=8000 --grpc-port=8001 --metrics-port=8002
