// ONNX Runtime custom op chattts.Int8BlockMatMul: Y = A x W for 8-bit weights quantized
// symmetrically in blocks along K (one fp32 scale per block and output column), with the
// activations rounded to int8 per block of the same length at run time: the numerics of
// MatMulNBits (bits 8, no zero points) at accuracy_level 4, in a weight layout made for
// AVX-512 VNNI. Why it exists and what it measures: docs/decode-speed.md, "An int8 kernel of
// our own".
//
// Inputs (the weights packed by chattts_serving/int8_kernel.py):
//   A   float32 [..., K]
//   W   int8    [P, K/4, 64, 4]   column panels of 64 outputs; per group of 4 k, the 4 int8 of
//                                 each of the panel's 64 columns (the weight minus 128)
//   S   float32 [P, K/block, 64]  the weight scale per block and column
//   Z   int32   [P, K/block, 64]  -128 x the sum of the block's int8 weights per column, the
//                                 correction for the activations' offset (VNNI multiplies u8 by s8)
// Output: Y float32 [..., N]; attributes K, N, block_size. Columns past N in the last panel are
// zero padding and are not written.
// Attribute gated (default 0): 1 takes A as [..., 2K], the packed gate | up projection of a
// LLaMA MLP, and multiplies silu(gate) * up (SiLU = x * sigmoid(x), QuickGelu with alpha 1), the
// Split, QuickGelu and Mul nodes before the down projection folded into its activation rounding.
//
// Per block: q = round(a * 127 / max|a|) in [-127, 127], stored as q + 128 (u8); the block's
// integer dot product is sum (q + 128) w - 128 sum w; Y += (max|a| / 127) * scale * dot.
// Rows are split across ONNX Runtime's intra-op threads for quantizing, column panels for
// multiplying (KernelContext_ParallelFor: the session's own thread pool).
//
// The kernels are compiled for AVX-512 (F, BW, VNNI) by function attribute only: the library
// loads on any x86-64, and RegisterCustomOps refuses a CPU without those instructions.

// GCC 12's own AVX-512 headers trip -Wmaybe-uninitialized (their `__Y = __Y` placeholders).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <onnxruntime_c_api.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ort_op.h"
#include "vector_math.h"

namespace {

#define CHATTTS_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

using chattts_ort::api;
using chattts_ort::data_of;
using chattts_ort::dims_of;
constexpr int kPanel = 64;  // output columns per panel: 4 zmm of 16 fp32

struct Job {
  const float* a;
  float* gated;  // per row, silu(gate) * up (gated mode), else null
  uint8_t* qa;
  float* sa;
  const int8_t* w;
  const float* s;
  const int32_t* z;
  float* y;
  int64_t m, k, n, block, panels;
};

CHATTTS_AVX512 void quantize_row(const float* a, int64_t k, int64_t block, uint8_t* q, float* scale) {
  const int64_t nb = k / block;
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = a + b * block;
    __m512 mx = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= block; i += 16) mx = _mm512_max_ps(mx, _mm512_and_ps(_mm512_loadu_ps(x + i), sign));
    float amax = _mm512_reduce_max_ps(mx);
    for (; i < block; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    scale[b] = amax / 127.0f;
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i off = _mm512_set1_epi32(128);
    uint8_t* out = q + b * block;
    for (i = 0; i + 16 <= block; i += 16) {
      __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv)), off);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtusepi32_epi8(v));
    }
    for (; i < block; ++i) out[i] = static_cast<uint8_t>(static_cast<int>(std::nearbyint(x[i] * inv)) + 128);
  }
}

// MR rows x one panel (64 columns, 4 zmm). acc starts at Z (the offset correction) per block;
// 4 k of a row (4 u8) are broadcast as one int32 and multiplied into each zmm of weights.
template <int MR>
CHATTTS_AVX512 void panel_rows(const uint8_t* qa, const float* sa, int64_t k, int64_t nb, int64_t block,
                               const int8_t* w, const float* s, const int32_t* z, float* y, int64_t n,
                               int64_t cols) {
  __m512 f[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < 4; ++g) f[r][g] = _mm512_setzero_ps();
  const int64_t quads = block / 4;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i acc[MR][4];
    for (int g = 0; g < 4; ++g) {
      const __m512i zg = _mm512_loadu_si512(z + b * kPanel + g * 16);
      for (int r = 0; r < MR; ++r) acc[r][g] = zg;
    }
    const int8_t* wb = w + b * quads * 4 * kPanel;
    for (int64_t q = 0; q < quads; ++q) {
      const int8_t* wq = wb + q * 4 * kPanel;
      const __m512i w0 = _mm512_loadu_si512(wq), w1 = _mm512_loadu_si512(wq + 64);
      const __m512i w2 = _mm512_loadu_si512(wq + 128), w3 = _mm512_loadu_si512(wq + 192);
      for (int r = 0; r < MR; ++r) {
        int32_t four;
        std::memcpy(&four, qa + r * k + (b * quads + q) * 4, 4);
        const __m512i x = _mm512_set1_epi32(four);
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], x, w0);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], x, w1);
        acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], x, w2);
        acc[r][3] = _mm512_dpbusd_epi32(acc[r][3], x, w3);
      }
    }
    for (int g = 0; g < 4; ++g) {
      const __m512 sg = _mm512_loadu_ps(s + b * kPanel + g * 16);
      for (int r = 0; r < MR; ++r)
        f[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][g]), _mm512_mul_ps(sg, _mm512_set1_ps(sa[r * nb + b])),
                                  f[r][g]);
    }
  }
  for (int g = 0; g < 4; ++g) {
    const int64_t left = cols - g * 16;
    if (left <= 0) break;
    const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
    for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + r * n + g * 16, mask, f[r][g]);
  }
}

// One row: the even and the odd groups of 4 k go to two sets of accumulators, 8 independent
// chains instead of 4, so that one row alone keeps the VNNI unit busy (it waits on the
// previous multiply-add otherwise).
CHATTTS_AVX512 void panel_row(const uint8_t* qa, const float* sa, int64_t nb, int64_t block, const int8_t* w,
                              const float* s, const int32_t* z, float* y, int64_t cols) {
  __m512 f[4];
  for (int g = 0; g < 4; ++g) f[g] = _mm512_setzero_ps();
  const int64_t quads = block / 4;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i even[4], odd[4];
    for (int g = 0; g < 4; ++g) {
      even[g] = _mm512_loadu_si512(z + b * kPanel + g * 16);
      odd[g] = _mm512_setzero_si512();
    }
    const int8_t* wb = w + b * quads * 4 * kPanel;
    const uint8_t* xb = qa + b * block;
    int64_t q = 0;
    for (; q + 2 <= quads; q += 2) {
      const int8_t* wq = wb + q * 4 * kPanel;
      int32_t x0, x1;
      std::memcpy(&x0, xb + q * 4, 4);
      std::memcpy(&x1, xb + q * 4 + 4, 4);
      const __m512i v0 = _mm512_set1_epi32(x0), v1 = _mm512_set1_epi32(x1);
      for (int g = 0; g < 4; ++g) {
        even[g] = _mm512_dpbusd_epi32(even[g], v0, _mm512_loadu_si512(wq + g * 64));
        odd[g] = _mm512_dpbusd_epi32(odd[g], v1, _mm512_loadu_si512(wq + 4 * kPanel + g * 64));
      }
    }
    if (q < quads) {
      int32_t x0;
      std::memcpy(&x0, xb + q * 4, 4);
      const __m512i v0 = _mm512_set1_epi32(x0);
      for (int g = 0; g < 4; ++g)
        even[g] = _mm512_dpbusd_epi32(even[g], v0, _mm512_loadu_si512(wb + q * 4 * kPanel + g * 64));
    }
    const __m512 sb = _mm512_set1_ps(sa[b]);
    for (int g = 0; g < 4; ++g)
      f[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(even[g], odd[g])),
                             _mm512_mul_ps(_mm512_loadu_ps(s + b * kPanel + g * 16), sb), f[g]);
  }
  for (int g = 0; g < 4; ++g) {
    const int64_t left = cols - g * 16;
    if (left <= 0) break;
    const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
    _mm512_mask_storeu_ps(y + g * 16, mask, f[g]);
  }
}

// Rows go in threes (12 chains), then a pair (8) or a single (panel_row).
CHATTTS_AVX512 void one_panel(const Job& j, int64_t p) {
  const int64_t nb = j.k / j.block;
  const int8_t* w = j.w + p * j.k * kPanel;
  const float* s = j.s + p * nb * kPanel;
  const int32_t* z = j.z + p * nb * kPanel;
  float* y = j.y + p * kPanel;
  const int64_t cols = j.n - p * kPanel < kPanel ? j.n - p * kPanel : kPanel;
  int64_t r = 0;
  for (; r + 3 <= j.m; r += 3)
    panel_rows<3>(j.qa + r * j.k, j.sa + r * nb, j.k, nb, j.block, w, s, z, y + r * j.n, j.n, cols);
  if (j.m - r == 2)
    panel_rows<2>(j.qa + r * j.k, j.sa + r * nb, j.k, nb, j.block, w, s, z, y + r * j.n, j.n, cols);
  else if (j.m - r == 1)
    panel_row(j.qa + r * j.k, j.sa + r * nb, nb, j.block, w, s, z, y + r * j.n, cols);
}

void run_panel(void* data, size_t p) { one_panel(*static_cast<Job*>(data), static_cast<int64_t>(p)); }

// silu(g) * u for K values: g / (1 + e^-g) * u.
CHATTTS_AVX512 void gate_row(const float* g, const float* u, int64_t k, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 e = chattts_math::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
  }
  for (; i < k; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void run_quantize(void* data, size_t row) {
  const Job& j = *static_cast<Job*>(data);
  const int64_t r = static_cast<int64_t>(row);
  const float* a = j.a + r * j.k;
  if (j.gated != nullptr) {
    float* x = j.gated + r * j.k;
    gate_row(j.a + r * 2 * j.k, j.a + r * 2 * j.k + j.k, j.k, x);
    a = x;
  }
  quantize_row(a, j.k, j.block, j.qa + r * j.k, j.sa + r * (j.k / j.block));
}

struct Kernel {
  int64_t k = 0, n = 0, block = 0, gated = 0;
};

OrtStatus* error(const std::string& msg) { return chattts_ort::invalid("Int8BlockMatMul: " + msg); }

OrtStatus* ORT_API_CALL compute(void* op_kernel, OrtKernelContext* ctx) {
  const Kernel& kn = *static_cast<Kernel*>(op_kernel);
  const OrtValue* in[4];
  for (size_t i = 0; i < 4; ++i) CHATTTS_RETURN_IF(api()->KernelContext_GetInput(ctx, i, &in[i]));
  std::vector<int64_t> adims, wdims, sdims, zdims;
  size_t acount = 0, wcount = 0, scount = 0, zcount = 0;
  CHATTTS_RETURN_IF(dims_of(in[0], adims, &acount));
  CHATTTS_RETURN_IF(dims_of(in[1], wdims, &wcount));
  CHATTTS_RETURN_IF(dims_of(in[2], sdims, &scount));
  CHATTTS_RETURN_IF(dims_of(in[3], zdims, &zcount));
  const int64_t panels = (kn.n + kPanel - 1) / kPanel;
  const int64_t a_width = kn.gated ? 2 * kn.k : kn.k;
  if (adims.empty() || adims.back() != a_width)
    return error("A's last dimension must be " + std::string(kn.gated ? "2K=" : "K=") +
                 std::to_string(a_width));
  if (wdims.size() != 4 || wdims[0] != panels || wdims[1] != kn.k / 4 || wdims[2] != kPanel || wdims[3] != 4)
    return error("W is not packed as [ceil(N/64), K/4, 64, 4]");
  const size_t per_block = static_cast<size_t>(panels * (kn.k / kn.block) * kPanel);
  if (scount != per_block || zcount != per_block)
    return error("S and Z must hold [ceil(N/64), K/block_size, 64] values");
  Job j{};
  j.m = static_cast<int64_t>(acount) / a_width;
  j.k = kn.k;
  j.n = kn.n;
  j.block = kn.block;
  j.panels = panels;
  std::vector<int64_t> ydims = adims;
  ydims.back() = kn.n;
  OrtValue* out = nullptr;
  CHATTTS_RETURN_IF(api()->KernelContext_GetOutput(ctx, 0, ydims.data(), ydims.size(), &out));
  CHATTTS_RETURN_IF(data_of(in[0], j.a));
  CHATTTS_RETURN_IF(data_of(in[1], j.w));
  CHATTTS_RETURN_IF(data_of(in[2], j.s));
  CHATTTS_RETURN_IF(data_of(in[3], j.z));
  CHATTTS_RETURN_IF(data_of(out, j.y));
  if (j.m == 0) return nullptr;
  thread_local std::vector<uint8_t> qa;
  thread_local std::vector<float> sa, gated;
  qa.resize(static_cast<size_t>(j.m * j.k));
  sa.resize(static_cast<size_t>(j.m * (j.k / j.block)));
  j.qa = qa.data();
  j.sa = sa.data();
  if (kn.gated) {
    gated.resize(static_cast<size_t>(j.m * j.k));
    j.gated = gated.data();
  }
  // A few rows quantize in microseconds on this thread: handing them to the pool would cost a
  // second wake-up of its threads.
  if (j.m <= 4)
    for (int64_t r = 0; r < j.m; ++r) run_quantize(&j, static_cast<size_t>(r));
  else
    CHATTTS_RETURN_IF(api()->KernelContext_ParallelFor(ctx, run_quantize, static_cast<size_t>(j.m), 0, &j));
  return api()->KernelContext_ParallelFor(ctx, run_panel, static_cast<size_t>(panels), 0, &j);
}

OrtStatus* ORT_API_CALL create(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
  auto* kn = new Kernel();
  OrtStatus* st = api()->KernelInfoGetAttribute_int64(info, "K", &kn->k);
  if (!st) st = api()->KernelInfoGetAttribute_int64(info, "N", &kn->n);
  if (!st) st = api()->KernelInfoGetAttribute_int64(info, "block_size", &kn->block);
  if (!st) {  // optional: absent is 0
    if (OrtStatus* absent = api()->KernelInfoGetAttribute_int64(info, "gated", &kn->gated)) {
      api()->ReleaseStatus(absent);
      kn->gated = 0;
    }
  }
  if (!st && (kn->k <= 0 || kn->n <= 0 || kn->block <= 0 || kn->block % 4 != 0 || kn->k % kn->block != 0))
    st = error("K, N and block_size must be positive, block_size a multiple of 4 dividing K");
  if (st) {
    delete kn;
    return st;
  }
  *kernel = kn;
  return nullptr;
}

struct Op {
  static constexpr const char* kName = "Int8BlockMatMul";
  static constexpr ONNXTensorElementDataType kInputs[4] = {
      ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
      ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32};
  static constexpr ONNXTensorElementDataType kOutputs[1] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  static constexpr auto create = ::create;
  static constexpr auto compute = ::compute;
  static void destroy(void* k) { delete static_cast<Kernel*>(k); }
};

const OrtCustomOp g_op = chattts_ort::make_op<Op>();

}  // namespace

// int8_attention.cc: chattts.Int8KvAttention, registered in the same domain.
const OrtCustomOp* chattts_attention_op();

extern "C" {

// Returns non-zero when this CPU runs the kernels (AVX-512 F, BW, VNNI).
__attribute__((visibility("default"))) int chattts_int8_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

// ONNX Runtime's entry point for SessionOptions.register_custom_ops_library: the ops in domain
// "chattts" (Int8BlockMatMul, Int8KvAttention), or an error naming the missing instructions.
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                              const OrtApiBase* base) {
  api() = base->GetApi(ORT_API_VERSION);
  if (api() == nullptr) return nullptr;  // cannot even report: onnxruntime older than the header
  if (!chattts_int8_supported())
    return api()->CreateStatus(ORT_NOT_IMPLEMENTED, "Int8BlockMatMul needs AVX-512 F, BW, DQ, VL and VNNI");
  OrtCustomOpDomain* domain = nullptr;
  CHATTTS_RETURN_IF(api()->CreateCustomOpDomain("chattts", &domain));
  CHATTTS_RETURN_IF(api()->CustomOpDomain_Add(domain, &g_op));
  CHATTTS_RETURN_IF(api()->CustomOpDomain_Add(domain, chattts_attention_op()));
  return api()->AddCustomOpDomain(options, domain);
}

}  // extern "C"
