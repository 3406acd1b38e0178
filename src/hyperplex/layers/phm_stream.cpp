// Streamed PHM product for inference on the CPU: y = x Hᵀ + b with H = Σᵢ Aᵢ ⊗ Sᵢ, never forming H.
//
// Built on demand by hyperplex/layers/native.py (torch.utils.cpp_extension); see that module for when it is used.
//
// Input: x (rows × n·d_n), the rule A (n × n × n) and the factors S (n × k_n × d_n). First the input blocks x_c are
// mixed by the rule, as in hyperplex.layers.functional.premix_inputs: pre-mixed row (b, a) holds [z_{a,1} … z_{a,n}],
// z_{a,i} = Σ_c Aᵢ[a, c] x_{b,c} (n²·d multiply-adds a row, 1/n of the product's). Then, with c = (b, a) running
// over the cols = rows·n pre-mixed rows, y (cols × k_n) is exactly the (rows, k) output, since its row (b, a),
// column q is output b, feature a·k_n + q:
//
//     y[c, q] = bias[(c mod n)·k_n + q] + Σᵢ Σⱼ S[i, q, j] · z[c, i·d_n + j]
//
// This is one GEMM of the dense layer's multiply-adds against the Sᵢ side by side, but BLAS packs its weight operand
// before a GEMM only a few columns wide, reading and writing the factors once more, and at one row the layer is bound
// by that weight traffic (docs/performance.md). This kernel reads every Sᵢ from memory once, in its stored layout,
// through register tiles of 12 accumulators (8 lanes each; with the operands, 15 of the 16 AVX2 registers) that run
// through all n factors before their sums leave the registers, while the next tile's rows are prefetched. Threads
// split the output features, so each output is summed by one thread in a fixed order whatever the thread count.
// Two tile forms:
//   - cols a multiple of 8 (n = 8, 16 at one row; most batches): lanes over pre-mixed rows, each Sᵢ entry broadcast
//     against 8 or 16 of them (tile_t). A tile's rows of the Sᵢ are read once for all of them.
//   - otherwise (n = 2, 4 at one row): lanes along j, 6 rows of the Sᵢ against 2 pre-mixed rows (tile), 12
//     multiply-adds per 8 loads, reduced across lanes at the end.
// GCC vector extensions keep it portable to other instruction sets.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float sum8(v8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Rows q0 … q0+RB-1 of factor i; rows past rb (the last tile of features) repeat row q0, so that the tiles' loops
// have fixed trip counts (their results are not stored).
template <int RB>
inline void factor_rows(const float* S, int64_t i, int64_t k_n, int64_t d_n, int64_t q0, int64_t rb,
                        const float* (&s)[RB]) {
  for (int r = 0; r < RB; ++r) s[r] = S + (i * k_n + q0 + (r < rb ? r : 0)) * d_n;
}

// Output feature q of pre-mixed row col (= b·n + a) is y[col, q], feature a·k_n + q of output b, with that bias.
inline void store(float* y, const float* bias, int64_t n, int64_t k_n, int64_t col, int64_t q, float value) {
  y[col * k_n + q] = value + (bias ? bias[(col % n) * k_n + q] : 0.f);
}

// Runs tile(q0, rb, c0, cw, ahead) over tiles of RB output features × W pre-mixed rows. Threads split the features
// (each task a contiguous run of tiles); `ahead`, the distance to the next tile's rows in a factor, is passed to the
// first column chunk of each tile whose successor is in the same task, so its rows are prefetched once.
template <int RB, int W, typename Tile>
void for_each_tile(int64_t k_n, int64_t d_n, int64_t cols, const Tile& tile) {
  const int64_t tiles = (k_n + RB - 1) / RB;
  at::parallel_for(0, tiles, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t q0 = t * RB, rb = std::min<int64_t>(RB, k_n - q0);
      const int64_t ahead = t + 1 < end && rb == RB ? RB * d_n : 0;
      for (int64_t c0 = 0; c0 < cols; c0 += W) tile(q0, rb, c0, std::min<int64_t>(W, cols - c0), c0 == 0 ? ahead : 0);
    }
  });
}

// One register tile: features q0 … q0+rb-1 against pre-mixed rows c0 … c0+cb-1, summed over all n factors, stored to
// y with the bias. Pre-mixed rows past cb repeat the first one, as factor rows past rb do. `ahead` is the distance
// to the next tile's rows in the same factor: prefetched while this one runs, into L2 (locality 1): they are used
// a whole tile later, after n factors' worth of rows have passed through L1 (cold stack, 4096², 2 threads: n = 8 / 16 at 0.11-0.17 / 0.09-0.16 x dense against 0.16-0.17 / 0.12 with the
// non-temporal hint and 0.17 / 0.15 without prefetching).
template <int RB, int CB>
void tile(const float* S, const float* z, const float* bias, float* y, int64_t n, int64_t k_n, int64_t d_n,
          int64_t q0, int64_t rb, int64_t c0, int64_t cb, int64_t ahead) {
  v8 acc[RB][CB];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) acc[r][c] = v8{};
  const int64_t vec_end = d_n / 8 * 8;
  for (int64_t i = 0; i < n; ++i) {
    const float* s[RB];
    const float* zc[CB];
    factor_rows<RB>(S, i, k_n, d_n, q0, rb, s);
    for (int c = 0; c < CB; ++c) zc[c] = z + (c0 + (c < cb ? c : 0)) * n * d_n + i * d_n;
    for (int64_t j = 0; j < vec_end; j += 8) {
      v8 zv[CB];
      for (int c = 0; c < CB; ++c) zv[c] = load8(zc[c] + j);
      if (ahead)
        for (int r = 0; r < RB; ++r) __builtin_prefetch(s[r] + ahead + j, 0, 1);
      for (int r = 0; r < RB; ++r) {
        const v8 sv = load8(s[r] + j);
        for (int c = 0; c < CB; ++c) acc[r][c] += sv * zv[c];
      }
    }
    if (vec_end < d_n)
      for (int r = 0; r < RB; ++r)
        for (int c = 0; c < CB; ++c)
          for (int64_t j = vec_end; j < d_n; ++j) acc[r][c][0] += s[r][j] * zc[c][j];
  }
  for (int r = 0; r < rb; ++r)
    for (int c = 0; c < cb; ++c) store(y, bias, n, k_n, c0 + c, q0 + r, sum8(acc[r][c]));
}

// z[(b, a), i·d_n + j] = Σ_c A[i, a, c] · x[b, c·d_n + j], one pre-mixed row per task item.
void premix(const float* x, const float* A, float* z, int64_t n, int64_t d_n, int64_t cols) {
  at::parallel_for(0, cols, 64, [&](int64_t begin, int64_t end) {
    for (int64_t col = begin; col < end; ++col) {
      const int64_t b = col / n, a = col % n;
      const float* xb = x + b * n * d_n;
      for (int64_t i = 0; i < n; ++i) {
        float* out = z + col * n * d_n + i * d_n;
        std::fill(out, out + d_n, 0.f);
        for (int64_t c = 0; c < n; ++c) {
          const float w = A[(i * n + a) * n + c];
          const float* xc = xb + c * d_n;
          for (int64_t j = 0; j < d_n; ++j) out[j] += w * xc[j];
        }
      }
    }
  });
}

// The transposed form, for a multiple of 8 pre-mixed rows: the 8 lanes run over pre-mixed rows c instead of j, each
// Sᵢ entry is broadcast once against CV·8 of them, and zt holds z transposed, (i, j) × cols. A tile then reads its
// rows of every Sᵢ once for all the pre-mixed rows of its chunk, and needs no reduction across lanes.
template <int RB, int CV>
void tile_t(const float* S, const float* zt, const float* bias, float* y, int64_t n, int64_t k_n, int64_t d_n,
            int64_t cols, int64_t q0, int64_t rb, int64_t c0, int64_t ahead) {
  v8 acc[RB][CV];
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < CV; ++v) acc[r][v] = v8{};
  for (int64_t i = 0; i < n; ++i) {
    const float* s[RB];
    factor_rows<RB>(S, i, k_n, d_n, q0, rb, s);
    const float* zi = zt + i * d_n * cols + c0;
    for (int64_t j = 0; j < d_n; ++j) {
      v8 zv[CV];
      for (int v = 0; v < CV; ++v) zv[v] = load8(zi + j * cols + 8 * v);
      if (ahead && (j & 15) == 0)
        for (int r = 0; r < RB; ++r) __builtin_prefetch(s[r] + ahead + j, 0, 1);
      for (int r = 0; r < RB; ++r) {
        const float sv = s[r][j];
        for (int v = 0; v < CV; ++v) acc[r][v] += sv * zv[v];
      }
    }
  }
  for (int r = 0; r < rb; ++r)
    for (int v = 0; v < CV; ++v)
      for (int l = 0; l < 8; ++l) store(y, bias, n, k_n, c0 + 8 * v + l, q0 + r, acc[r][v][l]);
}

template <int RB, int CV>
void stream_t(const float* S, const float* zt, const float* bias, float* y, int64_t n, int64_t k_n, int64_t d_n,
              int64_t cols) {
  for_each_tile<RB, 8 * CV>(k_n, d_n, cols, [&](int64_t q0, int64_t rb, int64_t c0, int64_t, int64_t ahead) {
    tile_t<RB, CV>(S, zt, bias, y, n, k_n, d_n, cols, q0, rb, c0, ahead);
  });
}

// W consecutive j of factor i (n a multiple of 8): zt[i·d_n + j + w, b·n + a] for every b, a, with W independent
// accumulators per 8 values of a, so that the multiply-adds over c do not wait on each other. W = 1 and W = 4 form
// the same sums in the same order, but may round them differently (the compiler's choice of fused multiply-adds
// differs; measured), which is why premix_t fixes the groups by (i, j) and not by how threads split the work.
template <int W>
void premix_t_group(const float* x, const float* At, float* zt, int64_t n, int64_t d_n, int64_t rows, int64_t i,
                    int64_t j) {
  const int64_t cols = rows * n, ij = i * d_n + j;
  const float* Ai = At + i * n * n;
  for (int64_t b = 0; b < rows; ++b) {
    const float* xb = x + b * n * d_n + j;
    for (int64_t a0 = 0; a0 < n; a0 += 8) {
      v8 acc[W];
      for (int w = 0; w < W; ++w) acc[w] = v8{};
      for (int64_t c = 0; c < n; ++c) {
        const v8 a = load8(Ai + c * n + a0);
        const float* xc = xb + c * d_n;
        for (int w = 0; w < W; ++w) acc[w] += xc[w] * a;
      }
      for (int w = 0; w < W; ++w) std::memcpy(zt + (ij + w) * cols + b * n + a0, &acc[w], sizeof acc[w]);
    }
  }
}

// The pre-mixed rows transposed, for tile_t: zt[i·d_n + j, b·n + a] = Σ_c A[i, a, c] · x[b, c·d_n + j], with At the
// rule as [i][c][a] so that the innermost loop runs over a, contiguous in both At and zt. The sums are kept in
// registers (n·n·d multiply-adds a row: at d = 4096, n = 16, writing them to zt after every c had cost 150 µs of a
// 0.5 ms call on one thread).
void premix_t(const float* x, const float* At, float* zt, int64_t n, int64_t d_n, int64_t rows) {
  const int64_t cols = rows * n;
  if (n % 8 == 0) {
    // Work items are groups of four j of one factor (the last group of a factor may be shorter and runs one j at a
    // time), fixed by (i, j) alone: how threads split them cannot change which sums are formed together.
    const int64_t groups = (d_n + 3) / 4;
    at::parallel_for(0, n * groups, 64, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        const int64_t i = g / groups, j = g % groups * 4;
        if (j + 4 <= d_n)
          premix_t_group<4>(x, At, zt, n, d_n, rows, i, j);
        else
          for (int64_t jj = j; jj < d_n; ++jj) premix_t_group<1>(x, At, zt, n, d_n, rows, i, jj);
      }
    });
    return;
  }
  at::parallel_for(0, n * d_n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t ij = begin; ij < end; ++ij) {
      const int64_t i = ij / d_n, j = ij % d_n;
      const float* Ai = At + i * n * n;
      for (int64_t b = 0; b < rows; ++b) {
        float* out = zt + ij * cols + b * n;
        const float* xb = x + b * n * d_n + j;
        for (int64_t a = 0; a < n; ++a) {
          float acc = 0.f;
          for (int64_t c = 0; c < n; ++c) acc += xb[c * d_n] * Ai[c * n + a];
          out[a] = acc;
        }
      }
    }
  });
}

template <int RB, int CB>
void stream(const float* S, const float* z, const float* bias, float* y, int64_t n, int64_t k_n, int64_t d_n,
            int64_t cols) {
  for_each_tile<RB, CB>(k_n, d_n, cols, [&](int64_t q0, int64_t rb, int64_t c0, int64_t cb, int64_t ahead) {
    tile<RB, CB>(S, z, bias, y, n, k_n, d_n, q0, rb, c0, cb, ahead);
  });
}

}  // namespace

torch::Tensor phm_stream(const torch::Tensor& x, const torch::Tensor& rule, const torch::Tensor& weight,
                         const c10::optional<torch::Tensor>& bias) {
  for (const torch::Tensor* t : {&x, &rule, &weight})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kFloat, "phm_stream: float32 CPU tensors only");
  TORCH_CHECK(weight.dim() == 3 && rule.dim() == 3 && x.dim() == 2, "phm_stream: x (rows, d), rule (n, n, n) and "
              "weight (n, k/n, d/n) expected");
  const int64_t n = weight.size(0), k_n = weight.size(1), d_n = weight.size(2), rows = x.size(0), cols = rows * n;
  TORCH_CHECK(rule.size(0) == n && rule.size(1) == n && rule.size(2) == n, "phm_stream: rule of shape (n, n, n) expected");
  TORCH_CHECK(x.size(1) == n * d_n, "phm_stream: x has ", x.size(1), " features, the weight takes ", n * d_n);
  if (bias.has_value())
    TORCH_CHECK(bias->device().is_cpu() && bias->scalar_type() == torch::kFloat && bias->numel() == n * k_n,
                "phm_stream: bias of k float32 expected");
  const torch::Tensor S = weight.contiguous(), xc = x.contiguous(), A = rule.contiguous();
  const torch::Tensor bias_c = bias.has_value() ? bias->contiguous() : torch::Tensor();
  const float* bias_ptr = bias.has_value() ? bias_c.data_ptr<float>() : nullptr;
  torch::Tensor y = torch::empty({rows, n * k_n}, x.options());  // every element is written once
  if (rows == 0) return y;
  // The pre-mixed rows: (cols, n·d_n) for tile, or transposed, (n·d_n, cols), for tile_t.
  torch::Tensor z = torch::empty({cols * n * d_n}, x.options());
  float *zp = z.data_ptr<float>(), *yp = y.data_ptr<float>();
  const float *Sp = S.data_ptr<float>(), *xp = xc.data_ptr<float>();
  if (cols % 8 == 0) {
    const torch::Tensor At = A.permute({0, 2, 1}).contiguous();  // [i][c][a]
    premix_t(xp, At.data_ptr<float>(), zp, n, d_n, rows);
    if (cols % 16 == 0)
      stream_t<6, 2>(Sp, zp, bias_ptr, yp, n, k_n, d_n, cols);
    else
      stream_t<12, 1>(Sp, zp, bias_ptr, yp, n, k_n, d_n, cols);
  } else {
    premix(xp, A.data_ptr<float>(), zp, n, d_n, cols);
    if (cols >= 2)
      stream<6, 2>(Sp, zp, bias_ptr, yp, n, k_n, d_n, cols);
    else
      stream<12, 1>(Sp, zp, bias_ptr, yp, n, k_n, d_n, cols);
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("phm_stream", &phm_stream, "x Hᵀ + bias for H = Σᵢ rule[i] ⊗ weight[i], reading every factor once "
        "(float32, CPU, no autograd)");
}
