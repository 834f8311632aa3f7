// Kernels of tierserve's set-associative embedding cache (cache/set_associative.py).
//
// Layout, shared with the numpy/cupy reference path (slot = set * ways + way):
//   keys   int64 [num_sets, ways]: an empty slot holds INT64_MIN;
//   ticks  uint32 [num_sets * ways]: batch number of the slot's last use;
//   values float32 [num_sets * ways, dim].
// A key's set (cache/hashing.py) is ts_set_of below.
//
// Writers (insert, update) are ordered against lookups by the host (same stream, sequence
// number); races between lookups only ever write the same kind of tick.

#define TS_EMPTY_KEY (-9223372036854775807LL - 1LL)
#define TS_AGE_EMPTY 4294967296LL  // 2**32: older than any real age, empty ways go first
#define TS_INSERT_MAX_THREADS 1024

__device__ __forceinline__ unsigned long long ts_set_of(long long key,
                                                        unsigned long long num_sets) {
  unsigned long long h = (unsigned long long)key * 0xFF51AFD7ED558CCDULL;
  h ^= h >> 32;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h >>= 32;
  h *= num_sets;
  h >>= 32;
  return h;
}

// Lanes that copy one row: the smallest power of two >= the row's float4 (dim % 4 == 0) or
// float count, at most 32.  cache/kernels.py's group_size is the same function.
__device__ __forceinline__ int ts_group_size(int dim) {
  const int units = (dim & 3) == 0 ? dim >> 2 : dim;
  int g = 1;
  while (g < units && g < 32) g <<= 1;
  return g;
}

// The way of `set` (ways slots) holding `key`, or -1, for one group of g lanes (lane gl of
// the group, whose first lane is `shift` in the warp): the lanes compare g ways at once.
// Every lane of the warp must call it with the same `loop_ways` (>= each group's ways):
// __ballot_sync needs the whole warp, and each group reads its own bits of the vote.
__device__ __forceinline__ int ts_probe(bool active, long long key, const long long* set,
                                        int ways, int loop_ways, int g, int gl, int shift) {
  const unsigned group_bits = g == 32 ? 0xffffffffu : ((1u << g) - 1u);
  int found = -1;
  for (int base = 0; base < loop_ways; base += g) {
    const int w = base + gl;
    const bool match = active && key != TS_EMPTY_KEY && w < ways && set[w] == key;
    const unsigned mine = (__ballot_sync(0xffffffffu, match) >> shift) & group_bits;
    if (mine && found < 0) found = base + __ffs(mine) - 1;
  }
  return found;
}

// Copy a row of dim floats with the g lanes of a group: float4s where dim % 4 == 0 and both
// rows are 16-byte aligned, else floats; either way consecutive lanes read consecutive words.
__device__ __forceinline__ void ts_copy_row(const float* src, float* dst, int dim, int g,
                                            int gl) {
  const bool vec4 = (dim & 3) == 0 &&
                    ((reinterpret_cast<unsigned long long>(src) |
                      reinterpret_cast<unsigned long long>(dst)) & 15ULL) == 0;
  if (vec4) {
    const float4* s4 = reinterpret_cast<const float4*>(src);
    float4* d4 = reinterpret_cast<float4*>(dst);
    for (int c = gl; c < (dim >> 2); c += g) d4[c] = s4[c];
  } else {
    for (int c = gl; c < dim; c += g) dst[c] = src[c];
  }
}

// One group of ts_group_size(dim) lanes per key (a warp at dim >= 128, 4 lanes at dim 16)
// probes the key's set (ts_probe) and copies the hit row (ts_copy_row).  The group's first
// lane writes the hit flag and stamps the slot's tick (every hit; tick < 0: none).  Hits are
// counted per block in shared memory and added to *hits once per block (the caller zeroes
// it).
extern "C" __global__ void ts_cache_lookup(const long long* __restrict__ keys, long long n,
                                           const long long* __restrict__ table_keys,
                                           unsigned int* __restrict__ ticks,
                                           unsigned long long num_sets, int ways,
                                           const float* __restrict__ values, int dim,
                                           float* __restrict__ out,
                                           unsigned char* __restrict__ hit,
                                           unsigned long long* __restrict__ hits, long long tick) {
  __shared__ unsigned int block_hits;
  if (threadIdx.x == 0) block_hits = 0;
  __syncthreads();
  const int g = ts_group_size(dim);  // divides 32, and blockDim.x is a multiple of 32
  const long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / g;
  const int lane = threadIdx.x & 31;
  const int gl = lane & (g - 1);  // lane within the group
  const bool active = i < n;
  const long long key = active ? keys[i] : TS_EMPTY_KEY;
  const unsigned long long first = active ? ts_set_of(key, num_sets) * (unsigned long long)ways
                                          : 0ULL;  // slot of way 0
  const int found = ts_probe(active, key, table_keys + first, ways, ways, g, gl, lane - gl);
  if (active) {
    if (found < 0) {
      if (gl == 0) hit[i] = 0;
    } else {
      const unsigned long long slot = first + (unsigned long long)found;
      ts_copy_row(values + slot * (unsigned long long)dim, out + i * (long long)dim, dim, g, gl);
      if (gl == 0) {
        hit[i] = 1;
        atomicAdd(&block_hits, 1u);
        if (tick >= 0) ticks[slot] = (unsigned int)(tick & 0xFFFFFFFFLL);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && block_hits) atomicAdd(hits, (unsigned long long)block_hits);
}

// ts_cache_lookup over the tables of a model in one launch (a request's lookups): `keys`
// holds every table's keys, table t's at key_offsets[t] .. key_offsets[t + 1]; its rows go
// to out + out_offsets[t] ([count, dims[t]]), its flags to hit + key_offsets[t], its hit
// count is added to hits[t] (zeroed by the caller), its slots are stamped ticks_now[t] (< 0:
// none).  Table t's arrays are at the device addresses table_keys_at[t], ticks_at[t],
// values_at[t]; `group` is ts_group_size of the largest dim.
extern "C" __global__ void ts_cache_lookup_tables(
    const long long* __restrict__ keys, long long n, int tables, int group,
    const long long* __restrict__ key_offsets, const long long* __restrict__ out_offsets,
    const long long* __restrict__ ticks_now, const unsigned long long* __restrict__ table_keys_at,
    const unsigned long long* __restrict__ ticks_at,
    const unsigned long long* __restrict__ values_at,
    const unsigned long long* __restrict__ num_sets, const int* __restrict__ ways,
    const int* __restrict__ dims, float* __restrict__ out, unsigned char* __restrict__ hit,
    unsigned long long* __restrict__ hits) {
  const int g = group;
  const long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / g;
  const int lane = threadIdx.x & 31;
  const int gl = lane & (g - 1);
  const bool active = i < n;
  int t = 0;
  if (active) {
    while (t + 1 < tables && key_offsets[t + 1] <= i) ++t;
  }
  const long long key = active ? keys[i] : TS_EMPTY_KEY;
  const int my_ways = active ? ways[t] : 0;
  int loop_ways = my_ways;  // the warp's largest: every lane runs ts_probe's loop as long
  for (int o = 16; o > 0; o >>= 1) loop_ways = max(loop_ways, __shfl_xor_sync(0xffffffffu, loop_ways, o));
  const long long* table_keys = reinterpret_cast<const long long*>(table_keys_at[t]);
  const unsigned long long first =
      active ? ts_set_of(key, num_sets[t]) * (unsigned long long)my_ways : 0ULL;
  const int found = ts_probe(active, key, table_keys + first, my_ways, loop_ways, g, gl, lane - gl);
  if (!active) return;  // no barrier or vote follows
  if (found < 0) {
    if (gl == 0) hit[i] = 0;
    return;
  }
  const int dim = dims[t];
  const unsigned long long slot = first + (unsigned long long)found;
  const float* values = reinterpret_cast<const float*>(values_at[t]);
  ts_copy_row(values + slot * (unsigned long long)dim,
              out + out_offsets[t] + (i - key_offsets[t]) * (long long)dim, dim, g, gl);
  if (gl == 0) {
    hit[i] = 1;
    atomicAdd(&hits[t], 1ULL);
    if (ticks_now[t] >= 0) {
      reinterpret_cast<unsigned int*>(ticks_at[t])[slot] = (unsigned int)(ticks_now[t] & 0xFFFFFFFFLL);
    }
  }
}

// The age of a slot at batch `now`: (now - tick) mod 2**32, TS_AGE_EMPTY for an empty slot.
__device__ __forceinline__ long long ts_age(const long long* table_keys,
                                            const unsigned int* ticks, unsigned long long slot,
                                            unsigned int now) {
  if (table_keys[slot] == TS_EMPTY_KEY) return TS_AGE_EMPTY;
  return (long long)(unsigned int)(now - ticks[slot]);
}

// Insert the unique `keys` (with rows `vectors[n, dim]`) that are not cached, stamped `tick`:
// the semantics of cpu_kernels.plan_insert + apply_insert, key by key.  Keys go in order;
// each takes the oldest way of its set (empty ways first, ties: the lowest way), never one
// stamped `tick`; keys its set cannot take are skipped (earlier keys win).  slots[i]
// receives the slot of keys[i] (-1: not inserted); counts[0] += inserted, counts[1] +=
// evicted (the caller zeroes counts).
//
// Block b owns the sets s with s % gridDim.x == b and is the only block that reads or
// writes them, so blocks need no synchronisation.  Each block walks all keys twice:
//  1. marks its keys that are EMPTY or already cached (before this insert) with -1, the
//     others (candidates) with -2;
//  2. in chunks of blockDim.x keys, in order: a candidate's rank is the number of earlier
//     candidates of its chunk in its set; it takes the way at position `rank` in the order
//     (age descending, way ascending) among ways of age > 0.  That is the way the keys one at
//     a time would leave it: each earlier key of the chunk took one of the better ones, and
//     earlier chunks' keys are in the table already, stamped `tick` (age 0).  After a
//     barrier the chosen slots are written and the rows copied (one warp per row).
// Launch with blockDim.x a multiple of 32, at most TS_INSERT_MAX_THREADS.
extern "C" __global__ void ts_cache_insert(const long long* __restrict__ keys, long long n,
                                           long long* table_keys, unsigned int* ticks,
                                           unsigned long long num_sets, int ways,
                                           const float* __restrict__ vectors, float* values,
                                           int dim, long long* __restrict__ slots,
                                           unsigned long long* __restrict__ counts,
                                           long long tick) {
  __shared__ int chunk_count;
  __shared__ unsigned int block_inserted, block_evicted;
  __shared__ long long chunk_index[TS_INSERT_MAX_THREADS];
  __shared__ unsigned long long chunk_set[TS_INSERT_MAX_THREADS];
  __shared__ long long chunk_slot[TS_INSERT_MAX_THREADS];
  const unsigned long long owners = gridDim.x;
  const unsigned long long owner = blockIdx.x;
  const unsigned int now = (unsigned int)(tick & 0xFFFFFFFFLL);
  if (threadIdx.x == 0) block_inserted = block_evicted = 0;

  for (long long i = threadIdx.x; i < n; i += blockDim.x) {  // 1. mark
    const long long key = keys[i];
    const unsigned long long set = ts_set_of(key, num_sets);
    if (set % owners != owner) continue;
    long long mark = -2;
    if (key == TS_EMPTY_KEY) {
      mark = -1;
    } else {
      const unsigned long long first = set * (unsigned long long)ways;
      for (int w = 0; w < ways; ++w) {
        if (table_keys[first + w] == key) {
          mark = -1;
          break;
        }
      }
    }
    slots[i] = mark;
  }
  __syncthreads();  // every mark read the table as it was before this insert

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x >> 5;
  for (long long start = 0; start < n; start += blockDim.x) {  // 2. place, chunk by chunk
    if (threadIdx.x == 0) chunk_count = 0;
    __syncthreads();
    const long long i = start + threadIdx.x;
    long long key = TS_EMPTY_KEY;
    unsigned long long set = 0;
    bool candidate = false;
    if (i < n) {
      key = keys[i];
      set = ts_set_of(key, num_sets);
      candidate = set % owners == owner && slots[i] == -2;
    }
    int at = -1;
    if (candidate) {
      at = atomicAdd(&chunk_count, 1);
      chunk_index[at] = i;
      chunk_set[at] = set;
    }
    __syncthreads();
    const int m = chunk_count;  // the same in every thread until the barrier at the end
    if (m > 0) {
      long long slot = -1;
      if (candidate) {
        int rank = 0;
        for (int j = 0; j < m; ++j) rank += (chunk_set[j] == set && chunk_index[j] < i) ? 1 : 0;
        const unsigned long long first = set * (unsigned long long)ways;
        for (int w = 0; w < ways && slot < 0; ++w) {
          const long long age = ts_age(table_keys, ticks, first + w, now);
          if (age <= 0) continue;  // stamped by this batch: never evicted
          int position = 0;
          for (int v = 0; v < ways; ++v) {
            const long long other = ts_age(table_keys, ticks, first + v, now);
            position += (other > age || (other == age && v < w)) ? 1 : 0;
          }
          if (position == rank) slot = (long long)(first + w);
        }
      }
      __syncthreads();  // every read of this chunk's sets before any write
      if (candidate) {
        slots[i] = slot;
        chunk_slot[at] = slot;
        if (slot >= 0) {
          if (table_keys[slot] != TS_EMPTY_KEY) atomicAdd(&block_evicted, 1u);
          atomicAdd(&block_inserted, 1u);
          table_keys[slot] = key;
          ticks[slot] = now;
        }
      }
      __syncthreads();  // chunk_slot complete
      for (int c = warp; c < m; c += warps) {
        const long long to = chunk_slot[c];
        if (to < 0) continue;
        const float* src = vectors + chunk_index[c] * (long long)dim;
        float* dst = values + to * (long long)dim;
        for (int d = lane; d < dim; d += 32) dst[d] = src[d];
      }
    }
    __syncthreads();  // the chunk's shared arrays are free again
  }
  if (threadIdx.x == 0 && (block_inserted || block_evicted)) {
    atomicAdd(&counts[0], (unsigned long long)block_inserted);
    atomicAdd(&counts[1], (unsigned long long)block_evicted);
  }
}
