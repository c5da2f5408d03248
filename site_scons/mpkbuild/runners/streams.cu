// The bandwidth node's streams (runners/bandwidth.py): the fastest way this GPU moves bytes
// for each read:write mix, to hold kernels against. Every byte of the buffers is moved once.
//
// Blocked: block b moves its own contiguous span of `span_bytes` of each buffer, each thread
// UNROLL 16-byte loads (non-caching) in flight per round. This is the access pattern of the
// kernels that move bytes fastest on an H200 (one CTA per contiguous row: argmax over a
// vocab row, a linear's weight rows, rmsnorm's rows), which torch's grid-stride copy and
// reductions do not reach.
//   mode 0, read:  every 16 bytes of a read, one word per block written (keeps the loads)
//   mode 1, copy:  out = a                  (1 read : 1 write)
//   mode 2, 2:1:   out = a ^ b              (2 reads : 1 write)
// Stores are plain or, with evict_first, st.global.cs.
// Modes 3 (read) and 4 (copy) load through a ring in shared memory instead: each thread
// keeps DEPTH 16-byte cp.async copies in flight (committed and consumed in batches of 4),
// as argmax_v2 streams its rows; `unroll` is DEPTH there (16, 32 or 48).
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace {

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <bool EVICT_FIRST>
__device__ __forceinline__ void store_stream(uint4* p, uint4 v) {
  if (EVICT_FIRST) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
  } else {
    *p = v;
  }
}

__device__ __forceinline__ uint4 xor4(uint4 a, uint4 b) {
  return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}

template <int MODE, int UNROLL, bool EVICT_FIRST>
__global__ void stream_blocked(const uint4* __restrict__ a, const uint4* __restrict__ b,
                               uint4* __restrict__ out, size_t n_vec, size_t span_vec,
                               unsigned* __restrict__ sink) {
  const size_t begin = static_cast<size_t>(blockIdx.x) * span_vec;
  const size_t end = begin + span_vec < n_vec ? begin + span_vec : n_vec;
  unsigned acc = 0;
  for (size_t i = begin + threadIdx.x; i < end; i += static_cast<size_t>(blockDim.x) * UNROLL) {
    uint4 va[UNROLL], vb[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const size_t j = i + static_cast<size_t>(u) * blockDim.x;
      va[u] = j < end ? load_stream(a + j) : make_uint4(0u, 0u, 0u, 0u);
      if (MODE == 2) vb[u] = j < end ? load_stream(b + j) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const size_t j = i + static_cast<size_t>(u) * blockDim.x;
      if (MODE == 0) {
        acc ^= va[u].x ^ va[u].y ^ va[u].z ^ va[u].w;
      } else if (j < end) {
        store_stream<EVICT_FIRST>(out + j, MODE == 2 ? xor4(va[u], vb[u]) : va[u]);
      }
    }
  }
  // a value no input makes in practice: keeps the read-only loads without a write each
  if (MODE == 0 && acc == 0x9e3779b9u) atomicAdd(sink, 1u);
}

__device__ __forceinline__ void ring_copy16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void ring_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void ring_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

constexpr int RING_BATCH = 4;

// MODE 3: read; MODE 4: copy to out. Thread t owns vectors begin + t, + blockDim.x, ... of
// its block's span, batch k of them in slot group k % GROUPS of its ring.
template <int MODE, int DEPTH, bool EVICT_FIRST>
__global__ void stream_ring(const uint4* __restrict__ a, uint4* __restrict__ out, size_t n_vec,
                            size_t span_vec, unsigned* __restrict__ sink) {
  constexpr int GROUPS = DEPTH / RING_BATCH;
  extern __shared__ __align__(16) uint4 ring[];
  const size_t begin = static_cast<size_t>(blockIdx.x) * span_vec;
  const size_t end = begin + span_vec < n_vec ? begin + span_vec : n_vec;
  const int tid = threadIdx.x, threads = blockDim.x;
  const size_t per_thread = (end - begin + threads - 1) / threads;
  const int batches = static_cast<int>((per_thread + RING_BATCH - 1) / RING_BATCH);
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  auto at = [&](int b, int u) { return begin + (static_cast<size_t>(b) * RING_BATCH + u) * threads + tid; };
  auto issue = [&](int b, int g) {
#pragma unroll
    for (int u = 0; u < RING_BATCH; ++u) {
      const size_t j = at(b, u);
      if (b < batches && j < end) ring_copy16(ring_s + ((g * RING_BATCH + u) * threads + tid) * 16, a + j);
    }
    ring_commit();   // empty groups past the end keep the group count uniform
  };
#pragma unroll
  for (int b = 0; b < GROUPS; ++b) issue(b, b);
  unsigned acc = 0;
  int g = 0;
#pragma unroll 1
  for (int b = 0; b < batches; ++b) {
    ring_wait<GROUPS - 1>();
#pragma unroll
    for (int u = 0; u < RING_BATCH; ++u) {
      const size_t j = at(b, u);
      const uint4 v = ring[(g * RING_BATCH + u) * threads + tid];
      if (j < end) {
        if (MODE == 3) acc ^= v.x ^ v.y ^ v.z ^ v.w;
        else store_stream<EVICT_FIRST>(out + j, v);
      }
    }
    issue(b + GROUPS, g);
    g = g + 1 == GROUPS ? 0 : g + 1;
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  if (MODE == 3 && acc == 0x9e3779b9u) atomicAdd(sink, 1u);
}

template <int MODE, int DEPTH, bool EVICT_FIRST>
int launch_ring(const void* a, void* out, size_t nbytes, size_t span_bytes, int threads,
                unsigned* sink, cudaStream_t stream) {
  const size_t n_vec = nbytes / sizeof(uint4), span_vec = span_bytes / sizeof(uint4);
  const unsigned blocks = static_cast<unsigned>((n_vec + span_vec - 1) / span_vec);
  const int smem = DEPTH * threads * static_cast<int>(sizeof(uint4));
  auto kernel = stream_ring<MODE, DEPTH, EVICT_FIRST>;
  int most = 0, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (smem > most) return -3;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return static_cast<int>(err);
  kernel<<<blocks, threads, smem, stream>>>(static_cast<const uint4*>(a), static_cast<uint4*>(out),
                                            n_vec, span_vec, sink);
  return static_cast<int>(cudaGetLastError());
}

template <int MODE, bool EVICT_FIRST>
int launch_ring_depth(const void* a, void* out, size_t nbytes, size_t span_bytes, int threads,
                      int depth, unsigned* sink, cudaStream_t stream) {
  switch (depth) {
    case 16: return launch_ring<MODE, 16, EVICT_FIRST>(a, out, nbytes, span_bytes, threads, sink, stream);
    case 32: return launch_ring<MODE, 32, EVICT_FIRST>(a, out, nbytes, span_bytes, threads, sink, stream);
    case 48: return launch_ring<MODE, 48, EVICT_FIRST>(a, out, nbytes, span_bytes, threads, sink, stream);
    default: return -2;
  }
}

template <int MODE, int UNROLL>
int launch(const void* a, const void* b, void* out, size_t nbytes, size_t span_bytes,
           int threads, bool evict_first, unsigned* sink, cudaStream_t stream) {
  const size_t n_vec = nbytes / sizeof(uint4), span_vec = span_bytes / sizeof(uint4);
  const unsigned blocks = static_cast<unsigned>((n_vec + span_vec - 1) / span_vec);
  auto* pa = static_cast<const uint4*>(a);
  auto* pb = static_cast<const uint4*>(b);
  auto* po = static_cast<uint4*>(out);
  // a shape whose block needs more registers than an SM has (2:1, 8 deep, 1024 threads)
  // cannot launch: say so before trying (-3), so a sweep can leave it out
  cudaFuncAttributes attr;
  cudaError_t err = evict_first ? cudaFuncGetAttributes(&attr, stream_blocked<MODE, UNROLL, true>)
                                : cudaFuncGetAttributes(&attr, stream_blocked<MODE, UNROLL, false>);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (threads > attr.maxThreadsPerBlock) return -3;
  if (evict_first) {
    stream_blocked<MODE, UNROLL, true><<<blocks, threads, 0, stream>>>(pa, pb, po, n_vec, span_vec, sink);
  } else {
    stream_blocked<MODE, UNROLL, false><<<blocks, threads, 0, stream>>>(pa, pb, po, n_vec, span_vec, sink);
  }
  return static_cast<int>(cudaGetLastError());
}

template <int MODE>
int launch_mode(const void* a, const void* b, void* out, size_t nbytes, size_t span_bytes,
                int threads, int unroll, bool evict_first, unsigned* sink, cudaStream_t stream) {
  switch (unroll) {
    case 4: return launch<MODE, 4>(a, b, out, nbytes, span_bytes, threads, evict_first, sink, stream);
    case 8: return launch<MODE, 8>(a, b, out, nbytes, span_bytes, threads, evict_first, sink, stream);
    default: return -2;
  }
}

}  // namespace

// One launch over `nbytes` of each buffer (a; b for mode 2; out for modes 1 and 2): 0, or
// the CUDA error of the launch (-1: sizes not multiples of 16, -2: an unknown mode or depth,
// -3: more threads, or shared memory, than this shape's block can have).
extern "C" int mpkb_stream(int mode, const void* a, const void* b, void* out, size_t nbytes,
                           size_t span_bytes, int threads, int unroll, int evict_first,
                           unsigned* sink, cudaStream_t stream) {
  if (nbytes % 16 || span_bytes % 16 || span_bytes == 0) return -1;
  switch (mode) {
    case 0: return launch_mode<0>(a, b, out, nbytes, span_bytes, threads, unroll, evict_first, sink, stream);
    case 1: return launch_mode<1>(a, b, out, nbytes, span_bytes, threads, unroll, evict_first, sink, stream);
    case 2: return launch_mode<2>(a, b, out, nbytes, span_bytes, threads, unroll, evict_first, sink, stream);
    case 3: return launch_ring_depth<3, false>(a, out, nbytes, span_bytes, threads, unroll, sink, stream);
    case 4: return evict_first ? launch_ring_depth<4, true>(a, out, nbytes, span_bytes, threads, unroll, sink, stream)
                               : launch_ring_depth<4, false>(a, out, nbytes, span_bytes, threads, unroll, sink, stream);
    default: return -2;
  }
}
