#!/usr/bin/env bash
# Regenerate server/grpc/gen/grpc_predict_v2_pb2.py from server/grpc/proto/grpc_predict_v2.proto.
# Needs grpcio-tools (dev dependency group): runs $PYTHON, else .venv/bin/python when the
# checkout has one (make setup), else python3. Only message classes are generated: the server
# registers its method handlers itself, under Triton's service name.
#
# The runtime version check that protoc writes into the module is removed so the committed
# module loads on any protobuf >= 4.25 (the project's floor), not only on the protoc's major.
set -euo pipefail
cd "$(dirname "$0")/../../.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$PYTHON" -m grpc_tools.protoc -Itierserve/v2=server/grpc/proto --python_out="$out" \
  server/grpc/proto/grpc_predict_v2.proto
"$PYTHON" - "$out/tierserve/v2/grpc_predict_v2_pb2.py" server/grpc/gen/grpc_predict_v2_pb2.py <<'PY'
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r"from google\.protobuf import runtime_version as _runtime_version\n", "", src)
src = re.sub(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n", "", src, flags=re.S)
open(sys.argv[2], "w").write(src)
PY
echo "wrote server/grpc/gen/grpc_predict_v2_pb2.py"
