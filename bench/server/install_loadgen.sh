#!/bin/sh
# Installs the native load generators bench/server/loadgen.py drives, if missing:
#   wrk     (HTTP/1.1, a Lua script POSTs the pre-built request)   Debian package wrk
#   h2load  (gRPC over HTTP/2, the pre-built framed request)       Debian package nghttp2-client
# Idempotent: does nothing when both are on PATH.  Needs root (or sudo) for apt-get.
#   sh bench/server/install_loadgen.sh
set -eu
missing=""
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"
command -v h2load >/dev/null 2>&1 || missing="$missing nghttp2-client"
[ -z "$missing" ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# another apt-get may hold the lock (the test setup installs services the same way): wait
$sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends $missing
command -v wrk >/dev/null && command -v h2load >/dev/null
