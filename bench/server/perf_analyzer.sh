#!/bin/sh
# Triton's perf_analyzer against tierserve serve and tritonserver serving the same DLRM
# (bench/server/perf_analyzer.py says what is measured; its options pass through):
#   sh bench/server/perf_analyzer.sh
#   sh bench/server/perf_analyzer.sh --train-dir /tmp/bench-dlrm --concurrency-range 1:64:9
# perf_analyzer is tritonclient's (.venv/bin/perf_analyzer). What it lacks is installed on
# first use: libb64.so.0d (Debian libb64-0d, here, with sudo when not root) and
# libcudart.so.12 (PyPI nvidia-cuda-runtime-cu12, into ~/.cache/tierserve/cudart, by the
# Python side, tests/services/perf_analyzer.py); tritonserver as the tests install it.
set -eu
cd "$(dirname "$0")/../.."
python=${PYTHON:-.venv/bin/python}
if ! ldconfig -p | grep -q 'libb64\.so\.0d'; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    # another apt-get may hold the lock (the test setup installs services the same way): wait
    $sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
        --no-install-recommends libb64-0d
fi
exec "$python" -m bench.server.perf_analyzer "$@"
