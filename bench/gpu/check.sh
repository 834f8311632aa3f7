#!/usr/bin/env bash
# The GPU check (issue 19): on a machine with a GPU and this repository, install tierserve with
# the gpu extra into a virtual environment, run every GPU-marked test, the GPU cache benchmark,
# the DLRM trainer on the GPU (against the CPU and PyTorch on the same GPU) and serving with
# the GPU cache; print one summary table and write it as JSON ($OUT/gpu_check.json when OUT is
# set, with the whole log as $OUT/gpu_check.log).
#
#   bench/gpu/check.sh                      # on the GPU machine (needs PyPI, or --wheelhouse)
#   bench/gpu/check.sh --cpu-dry-run --venv .venv   # the same steps on numpy, tiny sizes
#
# Options:
#   --cpu-dry-run       run every stage on numpy with tiny sizes (checks the script, no GPU)
#   --venv DIR          the virtual environment to create or reuse (default: the venv that
#                       --python runs in, if any, such as a CUDA image's torch venv; else
#                       /tmp/tierserve-gpu-venv, created with --system-site-packages, so a
#                       cupy or torch the machine already has is used, not reinstalled)
#   --wheelhouse DIR    install from the wheels in DIR only (no index): for a machine with no
#                       registry access; bench/gpu/wheelhouse.sh fills such a folder
#   --python PY         the Python that creates the venv (default python3)
#   --no-install        use the venv as it is
#   --seconds N         the whole check's time budget (default 450); steps that would start
#                       after it are skipped, a running step is cut at it
#
# A step that fails or times out is reported in the table; the others still run.  Exit status:
# 0 when every step ran and exited 0, else 1.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DRY=0
VENV=${TIERSERVE_GPU_VENV:-}
WHEELS=${TIERSERVE_WHEELHOUSE:-}
PY=${PYTHON:-python3}
INSTALL=1
BUDGET=450
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry-run) DRY=1 ;;
    --venv) VENV=$2; shift ;;
    --wheelhouse) WHEELS=$(cd "$2" && pwd); shift ;;
    --python) PY=$2; shift ;;
    --no-install) INSTALL=0 ;;
    --seconds) BUDGET=$2; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ -z "$VENV" ]; then
  VENV=$("$PY" -c 'import sys; print(sys.prefix if sys.prefix != sys.base_prefix else "")' 2>/dev/null || true)
  VENV=${VENV:-/tmp/tierserve-gpu-venv}
fi

WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
RESULTS=$WORK/results
mkdir -p "$RESULTS"
OUT_DIR=${OUT:-$WORK/out}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_check.log
: > "$LOG"
START=$(date +%s)
DEADLINE=$((START + BUDGET))
VPY=$VENV/bin/python
DRYFLAG=()
[ $DRY = 1 ] && DRYFLAG=(--cpu-dry-run)
export PYTHONUNBUFFERED=1 TIERSERVE_NO_PROGRESS=1
STEPS_JSON=$RESULTS/steps.json
echo '{}' > "$STEPS_JSON"

say() { echo "$*" | tee -a "$LOG"; }

record() {  # record NAME STATUS SECONDS
  python3 - "$STEPS_JSON" "$1" "$2" "$3" <<'EOF' 2>/dev/null || true
import json, sys
path, name, status, seconds = sys.argv[1:]
steps = json.load(open(path))
steps[name] = {"status": status, "seconds": int(seconds)}
json.dump(steps, open(path, "w"))
EOF
}

# step NAME LIMIT_SECONDS COMMAND...: run with a time limit (cut at the deadline), log to
# $WORK/NAME.log and the combined log, record ok / failed (rc) / timed out / skipped.
step() {
  local name=$1 limit=$2 left rc t0
  shift 2
  left=$((DEADLINE - $(date +%s)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 15 ]; then
    say "== $name: skipped (out of time)"
    record "$name" "skipped: out of time" 0
    return 0
  fi
  say "== $name (limit ${limit}s): $*"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  cat "$WORK/$name.log" >> "$LOG"
  tail -n 8 "$WORK/$name.log"
  local took=$(($(date +%s) - t0)) status="ok"
  if [ $rc = 124 ] || [ $rc = 137 ]; then status="timed out after ${limit}s"
  elif [ $rc != 0 ]; then status="failed (exit $rc)"; fi
  say "== $name: $status in ${took}s"
  record "$name" "$status" "$took"
  return 0
}

say "GPU check of $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?') on $(hostname), $(date -u +%FT%TZ), budget ${BUDGET}s$([ $DRY = 1 ] && echo ', CPU dry run')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$LOG"

if [ $INSTALL = 1 ]; then
  step install 240 env VENV="$VENV" ROOT="$ROOT" PY="$PY" WHEELS="$WHEELS" DRY=$DRY \
    bash "$ROOT/bench/gpu/install.sh"
fi
if [ ! -x "$VPY" ]; then
  say "no Python at $VPY: nothing else can run"
  exit 1
fi
cd "$ROOT"
step doctor 90 "$VPY" -m tierserve.clients.cli doctor --timeout 0.5
# The GPU tests: each file that marks one, and the whole folder of a conftest.py that does
# (its fixtures mark the tests of every file there).  Collecting the whole suite would need
# every dev extra.
mapfile -t GPU_FILES < <(grep -rlE "mark\.gpu|importorskip\(.cupy" tests --include='*.py' | sort)
GPU_DIRS=()
for f in "${GPU_FILES[@]}"; do
  [ "$(basename "$f")" = conftest.py ] && GPU_DIRS+=("$(dirname "$f")/")
done
GPU_PATHS=("${GPU_DIRS[@]}")
for f in "${GPU_FILES[@]}"; do
  covered=0
  for d in "${GPU_DIRS[@]}"; do [ "${f#"$d"}" != "$f" ] && covered=1; done
  [ $covered = 0 ] && GPU_PATHS+=("$f")
done
TESTS=("${GPU_PATHS[@]}" -m gpu --continue-on-collection-errors)
# Without a GPU those skip: the dry run runs the kernel compile and launch tests instead.
[ $DRY = 1 ] && TESTS=(tests/cuda tests/cache/test_kernel_launch.py tests/cache/test_gpu.py)
step tests 180 "$VPY" -m pytest "${TESTS[@]}" -q -p no:cacheprovider --timeout 120
grep -E "^(=+ )?[0-9]+ (passed|failed|error)|^=+ .*(passed|failed|error|skipped).* in [0-9.]+s" \
  "$WORK/tests.log" | tail -n 1 | python3 -c '
import json, re, sys
line = sys.stdin.read().strip("= \n")
count = lambda word: int(m.group(1)) if (m := re.search(rf"(\d+) {word}", line)) else 0
json.dump({"line": line or "no pytest summary", "passed": count("passed"),
           "failed": count("failed") if line else 1, "errors": count("error"),
           "skipped": count("skipped")}, open(sys.argv[1], "w"))
' "$RESULTS/tests.json"
for stage in cache trainer server; do
  step "$stage" 150 "$VPY" -m bench.gpu.run --stage "$stage" "${DRYFLAG[@]}" --json "$RESULTS/$stage.json"
done

say ""
"$VPY" -m bench.gpu.run --summary "$RESULTS" --out "$OUT_DIR/gpu_check.json" | tee -a "$LOG"
say "total $(($(date +%s) - START))s; logs in $WORK"
python3 - "$STEPS_JSON" <<'EOF'
import json, sys
sys.exit(0 if all(s["status"] == "ok" for s in json.load(open(sys.argv[1])).values()) else 1)
EOF
