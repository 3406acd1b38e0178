// Streamed PHM product for inference on the CPU: y = x Hᵀ + b with H = Σᵢ Aᵢ ⊗ Sᵢ, never forming H.
//
// Built on demand by hyperplex/layers/native.py (torch.utils.cpp_extension); see that module for when it is used.
//
// Input: the pre-mixed rows z (cols × n·d_n, from hyperplex.layers.functional.premix_inputs: row (b, a) holds
// [z_{a,1} … z_{a,n}], z_{a,i} = Σ_c Aᵢ[a, c] x_c) and the factors S (n × k_n × d_n). Output: y (cols × k_n), which
// is exactly the (rows, k) output, since row (b, a), column q of y is output b, feature a·k_n + q.
//
//     y[c, q] = bias[(c mod n)·k_n + q] + Σᵢ Σⱼ S[i, q, j] · z[c, i·d_n + j]
//
// This is one GEMM of the dense layer's multiply-adds against the Sᵢ side by side, but BLAS packs its weight operand
// before a GEMM only a few columns wide, reading and writing the factors once more, and at one row the layer is bound
// by that weight traffic (docs/performance.md). This kernel streams every Sᵢ from memory exactly once, in its stored
// layout: each thread owns a contiguous range of output features q and walks i outermost, so it reads n contiguous
// runs of S; a 6 × 2 register tile (6 rows of Sᵢ against 2 rows of z, 8 lanes wide: 12 accumulators, 15 of the 16
// AVX2 registers) does 12 multiply-adds per 8 loads. GCC vector extensions keep it portable to other instruction sets.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <vector>

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

// One register tile: features q0 … q0+rb-1 against pre-mixed rows c0 … c0+cb-1, the part of the sum that factors
// i0 … i1-1 contribute. Between calls the accumulators live in `saved` (8 lanes of partial sums per output): zero
// before factor 0, reduced across lanes and stored to y (plus bias) after factor n-1. Rows past rb / cb repeat the
// first one (their results are not stored), so the loops have fixed trip counts.
template <int RB, int CB>
void tile(const float* S, const float* z, const float* bias, float* y, v8* saved, int64_t n, int64_t k_n,
          int64_t d_n, int64_t i0, int64_t i1, int64_t q0, int64_t rb, int64_t c0, int64_t cb) {
  v8 acc[RB][CB];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) acc[r][c] = i0 == 0 ? v8{} : saved[r * CB + c];
  const int64_t vec_end = d_n / 8 * 8;
  for (int64_t i = i0; i < i1; ++i) {
    const float* s[RB];
    const float* zc[CB];
    for (int r = 0; r < RB; ++r) s[r] = S + (i * k_n + q0 + (r < rb ? r : 0)) * d_n;
    for (int c = 0; c < CB; ++c) zc[c] = z + (c0 + (c < cb ? c : 0)) * n * d_n + i * d_n;
    for (int64_t j = 0; j < vec_end; j += 8) {
      v8 zv[CB];
      for (int c = 0; c < CB; ++c) zv[c] = load8(zc[c] + j);
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
  if (i1 < n) {
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < CB; ++c) saved[r * CB + c] = acc[r][c];
    return;
  }
  for (int r = 0; r < rb; ++r)
    for (int c = 0; c < cb; ++c) {
      const int64_t col = c0 + c, q = q0 + r;
      y[col * k_n + q] = sum8(acc[r][c]) + (bias ? bias[(col % n) * k_n + q] : 0.f);
    }
}

// Each task owns a contiguous range of feature tiles. Long factor rows (d/n ≥ kLongRow): the range is walked in
// groups of kGroup tiles, factor i outermost, so the group's rows of every Sᵢ are read as one contiguous run
// (kGroup·RB rows) while the group's accumulators wait in cache between factors — the order that streams a large
// weight from memory at full speed. Short rows: each tile runs through all n factors with its accumulators in
// registers, since a j-loop of a few vectors per factor would spend more on saving and restoring them.
constexpr int64_t kGroup = 8;
constexpr int64_t kLongRow = 256;

template <int RB, int CB>
void stream(const float* S, const float* z, const float* bias, float* y, int64_t n, int64_t k_n, int64_t d_n,
            int64_t cols) {
  const int64_t tiles = (k_n + RB - 1) / RB, col_tiles = (cols + CB - 1) / CB;
  const bool grouped = d_n >= kLongRow;
  at::parallel_for(0, tiles, kGroup, [&](int64_t begin, int64_t end) {
    std::vector<v8> saved(grouped ? static_cast<size_t>(kGroup * col_tiles * RB * CB) : 0);
    for (int64_t g = begin; g < end; g += kGroup) {
      const int64_t g_end = std::min(g + kGroup, end);
      for (int64_t i = 0; i < (grouped ? n : 1); ++i)
        for (int64_t t = g; t < g_end; ++t) {
          const int64_t q0 = t * RB, rb = std::min<int64_t>(RB, k_n - q0);
          for (int64_t ct = 0; ct < col_tiles; ++ct) {
            const int64_t c0 = ct * CB, cb = std::min<int64_t>(CB, cols - c0);
            if (grouped)
              tile<RB, CB>(S, z, bias, y, saved.data() + ((t - g) * col_tiles + ct) * RB * CB, n, k_n, d_n, i, i + 1,
                           q0, rb, c0, cb);
            else
              tile<RB, CB>(S, z, bias, y, nullptr, n, k_n, d_n, 0, n, q0, rb, c0, cb);
          }
        }
    }
  });
}

torch::Tensor phm_stream(const torch::Tensor& weight, const torch::Tensor& z, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(weight.device().is_cpu() && z.device().is_cpu(), "phm_stream: CPU tensors only");
  TORCH_CHECK(weight.scalar_type() == torch::kFloat && z.scalar_type() == torch::kFloat, "phm_stream: float32 only");
  TORCH_CHECK(weight.dim() == 3 && z.dim() == 2, "phm_stream: weight (n, k/n, d/n) and z (cols, d) expected");
  const int64_t n = weight.size(0), k_n = weight.size(1), d_n = weight.size(2), cols = z.size(0);
  TORCH_CHECK(z.size(1) == n * d_n, "phm_stream: z has ", z.size(1), " columns, expected n·d/n = ", n * d_n);
  TORCH_CHECK(cols % n == 0, "phm_stream: z has ", cols, " rows, not a multiple of n = ", n);
  const torch::Tensor S = weight.contiguous(), zc = z.contiguous();
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == torch::kFloat && bias->numel() == n * k_n, "phm_stream: bias of k floats expected");
  const torch::Tensor bias_c = bias.has_value() ? bias->contiguous() : torch::Tensor();
  const float* bias_ptr = bias.has_value() ? bias_c.data_ptr<float>() : nullptr;
  torch::Tensor y = torch::empty({cols, k_n}, z.options());  // every element is written once, by the last factor
  if (cols >= 2)
    stream<6, 2>(S.data_ptr<float>(), zc.data_ptr<float>(), bias_ptr, y.data_ptr<float>(), n, k_n, d_n, cols);
  else
    stream<12, 1>(S.data_ptr<float>(), zc.data_ptr<float>(), bias_ptr, y.data_ptr<float>(), n, k_n, d_n, cols);
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("phm_stream", &phm_stream, "y = z [S_1 … S_n]ᵀ + bias, streaming the factors once (float32, CPU)");
}
