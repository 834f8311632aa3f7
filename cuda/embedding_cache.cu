// Hash probe of tierserve's set-associative embedding cache (cache/set_associative.py).
//
// Layout, shared with the numpy/cupy reference path (slot = set * ways + way):
//   keys   int64 [num_sets, ways]: an empty slot holds INT64_MIN;
//   ticks  uint32 [num_sets * ways]: batch number of the slot's last use;
//   values float32 [num_sets * ways, dim].
// A key's set (cache/hashing.py):
//   h = key * 0xFF51AFD7ED558CCD; h = (h ^ (h >> 32)) * 0xC4CEB9FE1A85EC53;
//   set = ((h >> 32) * num_sets) >> 32        (all mod 2^64)
//
// One warp per key: the lanes compare up to 32 ways at once (__ballot_sync), then copy the
// embedding row with coalesced loads.  Lane 0 writes the hit flag and stamps the slot's tick
// (every hit; the numpy path samples stamps in large batches to save passes).  The hits are
// counted per block in shared memory and added to *hits once per block (the caller zeroes
// it): the host reads one number instead of reducing the flags in a second launch.
// Races with other lookups only ever write the same kind of tick; writers (insert, update)
// are ordered against lookups by the host (same stream, sequence number).

#define TS_EMPTY_KEY (-9223372036854775807LL - 1LL)

extern "C" __global__ void ts_cache_lookup(const long long* __restrict__ keys, long long n,
                                           const long long* __restrict__ table_keys,
                                           unsigned int* __restrict__ ticks,
                                           unsigned long long num_sets, int ways,
                                           const float* __restrict__ values, int dim,
                                           float* __restrict__ out,
                                           unsigned char* __restrict__ hit,
                                           unsigned long long* __restrict__ hits, long long tick) {
  // tick < 0: do not stamp.
  __shared__ unsigned int block_hits;
  if (threadIdx.x == 0) block_hits = 0;
  __syncthreads();
  const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp < n) {  // uniform per warp: blockDim is a multiple of 32
    const long long key = keys[warp];
    unsigned long long h = (unsigned long long)key * 0xFF51AFD7ED558CCDULL;
    h ^= h >> 32;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h >>= 32;
    h *= num_sets;
    h >>= 32;
    const unsigned long long first = h * (unsigned long long)ways;  // slot of way 0
    const long long* set = table_keys + first;

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
    } else {
      const float* src = values + (first + found) * (unsigned long long)dim;
      float* dst = out + warp * (long long)dim;
      for (int i = lane; i < dim; i += 32) dst[i] = src[i];
      if (lane == 0) {
        hit[warp] = 1;
        atomicAdd(&block_hits, 1u);
        if (tick >= 0) ticks[first + found] = (unsigned int)(tick & 0xFFFFFFFFLL);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && block_hits) atomicAdd(hits, (unsigned long long)block_hits);
}
