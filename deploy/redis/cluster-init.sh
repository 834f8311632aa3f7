#!/bin/sh
# Joins the three nodes into one cluster (three masters, no replicas); a no-op once joined.
set -eu
if redis-cli -h redis-node-1 -p 7000 cluster info | grep -q "cluster_state:ok"; then
  echo "cluster already formed"
  exit 0
fi
yes yes | redis-cli --cluster create \
  redis-node-1:7000 redis-node-2:7001 redis-node-3:7002 \
  --cluster-replicas 0 --cluster-yes
