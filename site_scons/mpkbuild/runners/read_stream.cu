// The bandwidth node's read-only stream (runners/bandwidth.py compiles it with nvcc on the
// GPU's host and loads it with ctypes): a grid-stride pass over a buffer with eight 16-byte
// non-caching loads in flight per thread, folded into one word per thread that is stored
// only if it equals an impossible value, so no load is dropped and nothing is written.
// torch's reductions and a Triton stream read 2 GiB at 4.32-4.38 TB/s on an H200, below
// what argmax_v2 and linear_v2 reach (4.4-4.5): a ceiling has to be the fastest stream.
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace {
constexpr int kInFlight = 8;

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__global__ void __launch_bounds__(512) read_stream(const uint4* __restrict__ x, size_t n,
                                                  unsigned* __restrict__ sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (kInFlight - 1) * stride < n; i += kInFlight * stride) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = load_stream(x + i + u * stride);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = load_stream(x + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u && threadIdx.x == 1023) *sink = acc;  // never: threads <= 512
}
}  // namespace

// bytes: a multiple of 16; blocks x threads threads; stream: a cudaStream_t (0: default)
extern "C" int mpkb_read_stream(const void* x, size_t bytes, int blocks, int threads,
                                unsigned* sink, void* stream) {
  read_stream<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(x), bytes / 16, sink);
  return static_cast<int>(cudaGetLastError());
}
