#!/usr/bin/env bash
# Download into DIR (default .whl) the wheels that check.sh needs on a GPU machine that
# reaches no package registry but has Python, numpy, numba, cupy, torch and pytest already
# (such as a CUDA image with PyTorch): tierserve's other runtime dependencies, the redis extra
# and the build backend, for that machine's Python (default 3.12, x86_64 manylinux).  The
# versions are the ones installed in this repository's .venv where it has them.
#
#   bench/gpu/wheelhouse.sh [DIR] [PYTHON_VERSION]
#   then, on the GPU machine: bench/gpu/check.sh --wheelhouse DIR
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-$ROOT/.whl}
PYV=${2:-3.12}
PACKAGES=(pydantic pydantic-core annotated-types typing-inspection fastapi starlette uvicorn
          httptools rocksdict redis hiredis setuptools wheel packaging orjson opentelemetry-api
          protobuf grpcio)
LOCAL=$ROOT/.venv/bin/python
mkdir -p "$DIR"
specs=()
for p in "${PACKAGES[@]}"; do
  v=$("$LOCAL" -c "import importlib.metadata as m; print(m.version('$p'))" 2>/dev/null || true)
  specs+=("$p${v:+==$v}")
done
platforms=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do platforms+=(--platform "manylinux_${n}_x86_64"); done
python3 -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
  --python-version "$PYV" --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 \
  --platform any -d "$DIR" "${specs[@]}"
du -sh "$DIR"
ls "$DIR"
