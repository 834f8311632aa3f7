// Hash probe of tierserve's set-associative embedding cache (cache/set_associative.py).
//
// Layout, shared with the numpy/cupy reference path:
//   meta   int64 [num_sets, 2 * ways]: per set, `ways` keys then `ways` last-access ticks;
//          an empty slot holds the key INT64_MIN.
//   values float32 [num_sets * ways, dim]: slot (set * ways + way).
// A key's set is ((key * 0x9E3779B97F4A7C15 mod 2^64) >> 32) * num_sets >> 32
// (cache/hashing.py).
//
// One warp per key: the lanes compare up to 32 ways at once (__ballot_sync), then copy the
// embedding row with coalesced loads.  Lane 0 writes the hit flag and stamps the slot's tick.
// Races with other lookups only ever write the same kind of tick; writers (insert, update)
// are ordered against lookups by the host (same stream, sequence number).

#define TS_EMPTY_KEY (-9223372036854775807LL - 1LL)

extern "C" __global__ void ts_cache_lookup(const long long* __restrict__ keys, long long n,
                                           long long* __restrict__ meta,
                                           unsigned long long num_sets, int ways,
                                           const float* __restrict__ values, int dim,
                                           float* __restrict__ out,
                                           unsigned char* __restrict__ hit, long long tick) {
  const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= n) return;  // uniform per warp: blockDim is a multiple of 32

  const long long key = keys[warp];
  unsigned long long h = (unsigned long long)key * 0x9E3779B97F4A7C15ULL;
  h >>= 32;
  h *= num_sets;
  h >>= 32;
  long long* set = meta + h * 2ULL * (unsigned long long)ways;

  int found = -1;
  for (int base = 0; base < ways; base += 32) {
    const int w = base + lane;
    const bool match = w < ways && key != TS_EMPTY_KEY && set[w] == key;
    const unsigned mask = __ballot_sync(0xffffffffu, match);
    if (mask) {
      found = base + __ffs(mask) - 1;
      break;
    }
  }
  if (found < 0) {
    if (lane == 0) hit[warp] = 0;
    return;
  }
  const float* src = values + (h * (unsigned long long)ways + found) * (unsigned long long)dim;
  float* dst = out + warp * (long long)dim;
  for (int i = lane; i < dim; i += 32) dst[i] = src[i];
  if (lane == 0) {
    hit[warp] = 1;
    if (tick >= 0) set[ways + found] = tick;
  }
}
