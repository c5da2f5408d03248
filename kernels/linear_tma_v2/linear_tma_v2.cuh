// linear_tma_v2 task body: y[M, N] = x[M, K] . W[N, K]^T at decode M (1..16), bf16 in/out,
// fp32 accumulation, as a warp-role pipeline (codegen.pipeline in specs/linear_tma_v2.yaml):
// few large tasks (NT rows of W each, about one per SM), W streamed by TMA through a ring of
// STAGES stages.
//   loader (warp 0): one elected lane fills stage s % STAGES with a box of this task's W
//     (BOX_ROWS rows x 64 k) and the matching box of x (M rows x 64 k), both 128-byte
//     swizzled, completing on full[]; once the ring has wrapped it first waits on empty[].
//   mma (warps 1-4): warp w takes rows [16 w, 16 w + 16) of each W box (the warps past the
//     box's rows only keep the handshake) and runs mma.sync m16n8k16 with W as the A operand
//     and x as B (the decode M is the mma's n = 8 side: one n8 tile for M <= 8, two for 16);
//     (a stage's fragments all loaded before its mmas, two accumulator chains); each warp
//     hands the stage back with one arrival on empty[], and after a row block's
//     last k box writes its 16 rows of y.
// Steps go row block by row block, k box by k box: step s is row block s / KB, k box s % KB.
// The harness (or the runtime) passes x whole, this task's NT rows of W through weight_tmap
// (the pointer weight is at row t * NT, unused: the map is over the task's tile), and y at
// column t * NT of row 0 -- rows of y are N apart.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

namespace linear_tma_v2_detail {
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 { %0, %1 }, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
}
// d += a . b: a 16 x 16 (W rows x k), b 16 x 8 (k x x rows), fp32 accumulators
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#ifdef __CUDA_ARCH_FEAT_SM100_ALL
// sm_100a: the same ring, consumed by tcgen05 (the 5th-generation tensor cores) as upstream's
// linear_sm100_v2 does. Warp 1 (the mma role's first) owns TMEM and issues the MMAs: per stage
// it re-lays x's rows into 8-row core matrices (x_core: tcgen05's unswizzled B operand), then
// one lane issues BOX_K / 16 MMAs of M 128 (W rows; the box's BOX_ROWS are real, the rest
// never read out) x N 8 or 16 (x's rows) x K 16 into TMEM and commits them to empty[]; warps
// 2-4 arrive on empty[] once the stage is full. After a row block's last stage the commit
// goes to acc; the warps whose TMEM quarter (warp % 4) holds the block's rows read it out,
// add nothing, round to bf16 and store y's rows; all four meet before the next block's MMAs.
// Compiled and resource-checked here; never run (no sm_100a GPU in reach).
template <int M, int N, int K, int NT, int STAGES>
__device__ __forceinline__ void tcgen05_mma(__nv_bfloat16* __restrict__ y, char* smem, uint64_t* bars,
                                            const char* ring_w, const char* ring_x) {
  namespace P = linear_tma_v2_spec::pipeline;
  namespace T = linear_tma_v2_spec::pipeline::tc;
  using R = P::ring<M, N, K, NT, STAGES>;
  constexpr int BOX_K = linear_tma_v2_spec::BOX_K;
  constexpr int BOX_ROWS = P::tma_weight::box_rows(NT, K);
  constexpr int KB = K / BOX_K;
  constexpr int GROUPS = (M + 7) / 8;                    // 8-row core-matrix groups of x
  constexpr int MMA_N = 8 * GROUPS;                      // x's rows, padded: the MMA's N
  constexpr int MMA_M = 128;                             // W rows: TMEM lane i = row i
  constexpr uint32_t COLUMNS = 32;                       // TMEM columns (>= MMA_N, a power of 2)
  constexpr uint32_t X_CORE_BYTES = GROUPS * 8 * BOX_K * 2;
  constexpr uint32_t IDESC = T::instruction(MMA_M, MMA_N);
  const int warp = P::warp() - P::MMA_WARP_BEGIN, lane = P::lane();
  // the SMEM plan (codegen.smem, regions in order at their alignment): x_core after ring_x
  // at 128, tmem_slot after it at 16
  const size_t x_end = static_cast<size_t>(ring_x - smem) + STAGES * R::SLOT_X_BYTES;
  char* x_core = smem + (x_end + 127) / 128 * 128;
  uint32_t* tmem_slot = reinterpret_cast<uint32_t*>(x_core + STAGES * X_CORE_BYTES);
  if (warp == 0) T::alloc(tmem_slot, COLUMNS);
  T::before_sync();
  P::sync_epilogue();
  T::after_sync();
  const uint32_t tmem = *tmem_slot;

  int s = 0;
  for (int rb = 0; rb < NT / BOX_ROWS; ++rb) {
    for (int kb = 0; kb < KB; ++kb, ++s) {
      const int slot = R::slot(s);
      P::wait(&bars[R::FULL + slot], R::phase(s));
      if (warp != 0) {
        if (lane == 0) P::arrive(&bars[R::EMPTY + slot]);
        continue;
      }
      // x's rows (M x 128 bytes, 128-byte swizzled: chunk c of row r at chunk c ^ (r % 8))
      // into core matrices: chunk c of row r at (c * GROUPS + r / 8) * 128 + (r % 8) * 16
      const uint4* from = reinterpret_cast<const uint4*>(ring_x + slot * R::SLOT_X_BYTES);
      char* core = x_core + slot * X_CORE_BYTES;
      for (int i = lane; i < M * (BOX_K / 8); i += 32) {
        const int r = i / (BOX_K / 8), c = i % (BOX_K / 8);
        *reinterpret_cast<uint4*>(core + (c * GROUPS + r / 8) * 128 + (r % 8) * 16) =
            from[r * (BOX_K / 8) + (c ^ (r % 8))];
      }
      asm volatile("fence.proxy.async.shared::cta;" : : : "memory");   // seen by the MMAs' reads
      __syncwarp();
      T::after_sync();
      if (lane == 0) {
        const char* wbox = ring_w + slot * R::SLOT_W_BYTES;
#pragma unroll
        for (int kk = 0; kk < BOX_K / 16; ++kk) {
          // A: W, 128-byte swizzled rows, 8-row atoms 1024 bytes apart; a k16 step is 32 bytes
          // into the row. B: x's core matrices, K-adjacent GROUPS * 128 bytes apart
          const uint64_t a = T::descriptor(wbox + kk * 32, 16, 1024, 128);
          const uint64_t b = T::descriptor(core + kk * 2 * GROUPS * 128, GROUPS * 128, 128, 0);
          T::mma(tmem, a, b, IDESC, kb > 0 || kk > 0);
        }
        T::commit(&bars[R::EMPTY + slot]);
        if (kb == KB - 1) T::commit(&bars[R::ACC]);
      }
      __syncwarp();
    }
    // the row block's accumulator: lane i of TMEM is W row i, column j is x's row j
    P::wait(&bars[R::ACC], static_cast<uint32_t>(rb) & 1u);
    T::after_sync();
    const int quarter = P::warp() % 4;                    // the TMEM lanes this warp may read
    if (quarter * 32 < BOX_ROWS) {
      const int row = quarter * 32 + lane;
#pragma unroll
      for (int c0 = 0; c0 < MMA_N; c0 += 8) {
        float v[8];
        T::load8(v, tmem + (static_cast<uint32_t>(quarter * 32) << 16) + c0);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (c0 + j < M && row < BOX_ROWS)
            y[static_cast<size_t>(c0 + j) * N + rb * BOX_ROWS + row] = __float2bfloat16(v[j]);
        }
      }
    }
    T::before_sync();
    P::sync_epilogue();                                   // read out before it is overwritten
    T::after_sync();
  }
  if (warp == 0) T::dealloc(tmem, COLUMNS);
}
#endif
}  // namespace linear_tma_v2_detail

template <int M, int N, int K, int NT, int STAGES>
__device__ __forceinline__ void linear_tma_v2_task(const __nv_bfloat16* __restrict__ x,
                                                   const __nv_bfloat16* __restrict__ weight,
                                                   __nv_bfloat16* __restrict__ y,
                                                   const void* x_tmap, const void* weight_tmap,
                                                   int task_index, char* smem) {
  namespace P = linear_tma_v2_spec::pipeline;
  namespace D = linear_tma_v2_detail;
  using R = P::ring<M, N, K, NT, STAGES>;
  constexpr int BOX_K = linear_tma_v2_spec::BOX_K;                   // k a box row holds
  constexpr int BOX_ROWS = P::tma_weight::box_rows(NT, K);           // W rows a box holds
  constexpr int KB = K / BOX_K;                                      // k boxes a row block
  [[maybe_unused]] constexpr int TILES = (M + 7) / 8;                // n8 tiles of x's rows (sm_90a)
  constexpr uint32_t W_BYTES = R::SLOT_W_BYTES, X_BYTES = R::SLOT_X_BYTES;   // a stage's room
  static_assert(M >= 1 && M <= 16, "decode M: one or two n8 tiles");
  static_assert(BOX_K * 2 == 128, "a W box row is one 128-byte swizzle span");
  static_assert(BOX_ROWS % 16 == 0 && BOX_ROWS <= 16 * P::MMA_WARPS, "16 W rows an mma warp");
  static_assert(NT % BOX_ROWS == 0 && K % BOX_K == 0, "whole boxes");
  static_assert(R::STEPS == (NT / BOX_ROWS) * KB, "the ring's steps are the task's boxes");
  (void)x;
  (void)weight;
  (void)task_index;
  // the SMEM plan (codegen.smem): mbarriers at 0, ring_w at 1024 (its 1024 alignment), ring_x
  // right after ring_w (STAGES W boxes, a whole number of KiB)
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  char* ring_w = smem + 1024;
  char* ring_x = ring_w + STAGES * W_BYTES;
  R::begin(bars);

  if (P::is_loader()) {
    if (P::elect_one()) {
      P::prefetch_map(weight_tmap);
      P::prefetch_map(x_tmap);
      for (int s = 0; s < R::STEPS; ++s) {
        const int slot = R::slot(s);
        if (s >= R::STAGES) P::wait(&bars[R::EMPTY + slot], R::phase(s) ^ 1u);
        P::arrive_expect_tx(&bars[R::FULL + slot], R::FULL_TX_BYTES);
        const int kcol = (s % KB) * BOX_K, wrow = (s / KB) * BOX_ROWS;
        P::copy_box(ring_w + slot * W_BYTES, weight_tmap, kcol, wrow, &bars[R::FULL + slot]);
        P::copy_box(ring_x + slot * X_BYTES, x_tmap, kcol, 0, &bars[R::FULL + slot]);
      }
    }
    return;
  }
  if (!P::is_mma()) return;
#ifdef __CUDA_ARCH_FEAT_SM100_ALL
  D::tcgen05_mma<M, N, K, NT, STAGES>(y, smem, bars, ring_w, ring_x);
#else
  const int warp = P::warp() - P::MMA_WARP_BEGIN, lane = P::lane();
  const bool active = warp * 16 < BOX_ROWS;
  // ldmatrix addresses of this lane (each lane names one 16-byte row of an 8 x 8 matrix):
  // A (W, x4): rows 16 warp + (lane % 8) + 8 ((lane / 8) % 2), k chunk lane / 16 of the k16
  // step; B (x, x2): x row lane % 8 (the last of x's rows where M < 8: the columns past M
  // are never stored), k chunk (lane / 8) % 2. Both boxes are 128-byte swizzled (row r's
  // 16-byte chunk c sits at chunk c ^ (r % 8)), so a matrix's 8 rows hit 8 bank groups
  const int a_row = warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
  const int a_chunk = lane / 16;
  const int b_chunk = (lane / 8) % 2;
  int b_row[TILES];
#pragma unroll
  for (int t = 0; t < TILES; ++t) b_row[t] = min(t * 8 + (lane % 8), M - 1);

  int s = 0;
  for (int rb = 0; rb < NT / BOX_ROWS; ++rb) {
    // two accumulator sets (even and odd k16 steps): two mma chains in flight, not one
    float acc[2][TILES][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int t = 0; t < TILES; ++t) acc[h][t][0] = acc[h][t][1] = acc[h][t][2] = acc[h][t][3] = 0.f;
    for (int kb = 0; kb < KB; ++kb, ++s) {
      const int slot = R::slot(s);
      P::wait(&bars[R::FULL + slot], R::phase(s));
      if (active) {
        const char* wbox = ring_w + slot * W_BYTES;
        const char* xbox = ring_x + slot * X_BYTES;
        // every fragment of the stage first, then the mmas: the asm statements keep their
        // order, so loading inside the mma loop made each mma wait out its own ldmatrix
        // (the profile's short-scoreboard stalls at m16, two tiles a k16 step)
        uint32_t a[BOX_K / 16][4], b[BOX_K / 16][TILES][2];
#pragma unroll
        for (int kk = 0; kk < BOX_K / 16; ++kk) {
          D::ldmatrix_x4(a[kk], wbox + a_row * 128 + (((kk * 2 + a_chunk) ^ (a_row % 8)) * 16));
#pragma unroll
          for (int t = 0; t < TILES; ++t)
            D::ldmatrix_x2(b[kk][t], xbox + b_row[t] * 128 + (((kk * 2 + b_chunk) ^ (b_row[t] % 8)) * 16));
        }
#pragma unroll
        for (int kk = 0; kk < BOX_K / 16; ++kk)
#pragma unroll
          for (int t = 0; t < TILES; ++t) D::mma_16816(acc[kk % 2][t], a[kk], b[kk][t]);
      }
      __syncwarp();
      if (lane == 0) P::arrive(&bars[R::EMPTY + slot]);
    }
    if (active) {
      // acc[.][t]: rows (lane / 4) and + 8 of the warp's 16, columns t * 8 + 2 (lane % 4) (+ 1)
      const int row = rb * BOX_ROWS + warp * 16 + lane / 4;
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int col = t * 8 + 2 * (lane % 4) + (c % 2);
          if (col < M)
            y[static_cast<size_t>(col) * N + row + (c / 2) * 8] = __float2bfloat16(acc[0][t][c] + acc[1][t][c]);
        }
      }
    }
  }
#endif
}
