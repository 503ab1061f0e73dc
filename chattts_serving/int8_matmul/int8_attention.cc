// ONNX Runtime custom op chattts.Int8KvAttention: the fused GPT step's attention over an int8
// KV cache, reading the cache as int8 (no dequantized copy of it): what
// com.microsoft.GroupQueryAttention computes with do_rotary 1 (rotate-half), kv_num_heads =
// num_heads, kv_cache_bit_width 8 and PER_CHANNEL k_quant_type / v_quant_type, as the fused
// graph uses it (chattts_serving/engine/kvprecision.py). Why it exists and what it measures:
// docs/decode-speed.md, "Attention over the int8 cache".
//
// Inputs:
//   qkv        float32 [B, S, 3 * heads * D]   q | k | v of the new tokens, head-major in each
//   past_key   int8    [B, heads, C, D]        the cache (C = 0 for a first prompt)
//   past_value int8    [B, heads, C, D]
//   seqlens_k  int32   [B]                     row b's positions after this call, minus 1
//   total_sequence_length int32 [1]            max(seqlens_k) + 1
//   cos_cache, sin_cache float32 [P, D/2]      rotary tables by position
//   k_scale, v_scale float32 [heads, 1, D]     one static scale per head and channel
// Outputs:
//   attn          float32 [B, S, heads * D]
//   present_key   int8    [B, heads, max(C, total), D]  the past, and the new positions
//   present_value int8    [B, heads, max(C, total), D]
// Attributes: num_heads, scale (the softmax scale, D^-0.5).
//
// Positions: a first prompt (C = 0, or total = S) writes positions 0..S-1 of every row (a
// right-padded row's padding too, never read for its real positions: causal attention); else
// row b's new tokens go to seqlens_k[b] + 1 - S onwards. Each new key is rotated at its
// position, then k and v are rounded to int8 per head and channel, round(x / scale) clamped to
// [-128, 127] (GroupQueryAttention's rounding, checked by tests/unit/test_int8_attention.py).
// Query s of row b attends to positions 0..its own, causally.
//
// The cache may be bound to both past and present (one buffer, IO binding: the engine's); then
// only the new positions are written. Otherwise the past is copied first.
//
// Per (row, head): the key scale folds into the query (score = sum_c q_c k_scale_c k_int_c), the
// value scale into the output (out_c = v_scale_c sum_t p_t v_int_c), so the loops read the int8
// cache and convert it in registers. Rows x heads go to ONNX Runtime's intra-op threads when
// there is enough work to pay for waking them.

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <onnxruntime_c_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ort_op.h"
#include "vector_math.h"

#define CHATTTS_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

namespace chattts_attention {

using chattts_ort::api;
using chattts_ort::data_of;
using chattts_ort::dims_of;
constexpr int64_t kMaxChunks = 16;  // head_dim up to 256, in chunks of 16 fp32
constexpr int64_t kInlineWork = 4096;
// Below this many (row, head, position) reads per call the op runs on the calling thread: a call
// of one row (12 heads x a few hundred positions) takes microseconds, less than waking the pool.

struct Job {
  const float* qkv;
  const int8_t* past_k;
  const int8_t* past_v;
  int8_t* k;
  int8_t* v;
  const float* cos;
  const float* sin;
  const float* ks;
  const float* vs;
  float* out;
  const int64_t* start;  // per row: the position of its first new token
  int64_t b, s, heads, d, past_cap, cap;
  float scale;
};

// The 16 sums of a[0..15]'s lanes, lane i holding a[i]'s: pairs added through unpacks, then
// 128-bit lanes through shuffles (45 operations where 16 horizontal sums take about 130).
CHATTTS_AVX512 inline __m512 sum16(const __m512* a) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
  const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x44), _mm512_shuffle_f32x4(c[0], c[1], 0xEE));
  const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x44), _mm512_shuffle_f32x4(c[2], c[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xDD));
}

CHATTTS_AVX512 inline __m512 load_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// x (D fp32) rotated at position pos (rotate-half: channel c pairs with c + D/2) into y.
inline void rotate(const float* x, const float* cos, const float* sin, int64_t d, float* y) {
  const int64_t h = d / 2;
  for (int64_t c = 0; c < h; ++c) {
    y[c] = x[c] * cos[c] - x[c + h] * sin[c];
    y[c + h] = x[c + h] * cos[c] + x[c] * sin[c];
  }
}

// round(x / scale) clamped to int8, 16 at a time (the rounding mode is the default: to nearest even).
CHATTTS_AVX512 void quantize(const float* x, const float* scale, int64_t d, int8_t* q) {
  for (int64_t c = 0; c < d; c += 16) {
    const __m512 y = _mm512_div_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(scale + c));
    const __m512i i = _mm512_cvtps_epi32(_mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c), _mm512_cvtsepi32_epi8(i));
  }
}

CHATTTS_AVX512 void attend(const Job& j, int64_t task) {
  const int64_t b = task / j.heads, h = task % j.heads, d = j.d, chunks = d / 16, hd = j.heads * d;
  int8_t* kc = j.k + (b * j.heads + h) * j.cap * d;
  int8_t* vc = j.v + (b * j.heads + h) * j.cap * d;
  const int64_t start = j.start[b];
  if (j.past_k != j.k && j.past_cap > 0) {  // present is not the past's buffer: carry the past over
    const int64_t keep = std::min(j.past_cap, j.cap) * d;
    std::memcpy(kc, j.past_k + (b * j.heads + h) * j.past_cap * d, static_cast<size_t>(keep));
    std::memcpy(vc, j.past_v + (b * j.heads + h) * j.past_cap * d, static_cast<size_t>(keep));
  }
  const float* ks = j.ks + h * d;
  const float* vs = j.vs + h * d;
  const int64_t half = d / 2;
  alignas(64) float tmp[kMaxChunks * 16];
  for (int64_t s = 0; s < j.s; ++s) {
    const int64_t pos = start + s;
    const float* row = j.qkv + (b * j.s + s) * 3 * hd;
    rotate(row + hd + h * d, j.cos + pos * half, j.sin + pos * half, d, tmp);
    quantize(tmp, ks, d, kc + pos * d);
    quantize(row + 2 * hd + h * d, vs, d, vc + pos * d);
  }
  thread_local std::vector<float> scores;
  scores.resize(static_cast<size_t>(start + j.s + 16));
  float* sc = scores.data();
  for (int64_t s = 0; s < j.s; ++s) {
    const int64_t pos = start + s, n = pos + 1;
    const float* row = j.qkv + (b * j.s + s) * 3 * hd;
    rotate(row + h * d, j.cos + pos * half, j.sin + pos * half, d, tmp);
    __m512 q[kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c)
      q[c] = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(tmp + c * 16), _mm512_loadu_ps(ks + c * 16)),
                           _mm512_set1_ps(j.scale));
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + 16 <= n; t += 16) {  // sixteen positions' dot products, reduced into one register
      __m512 a[16];
      const int8_t* k0 = kc + t * d;
      for (int i = 0; i < 16; ++i) {
        a[i] = _mm512_mul_ps(q[0], load_i8(k0 + i * d));
        for (int64_t c = 1; c < chunks; ++c) a[i] = _mm512_fmadd_ps(q[c], load_i8(k0 + i * d + c * 16), a[i]);
      }
      _mm512_storeu_ps(sc + t, sum16(a));
    }
    for (; t < n; ++t) {
      __m512 a = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c) a = _mm512_fmadd_ps(q[c], load_i8(kc + t * d + c * 16), a);
      sc[t] = _mm512_reduce_add_ps(a);
    }
    t = 0;
    for (; t + 16 <= n; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sc + t));
    float m = _mm512_reduce_max_ps(mx);
    for (; t < n; ++t) m = std::max(m, sc[t]);
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (t = 0; t + 16 <= n; t += 16) {
      const __m512 e = chattts_math::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(sc + t), vm));
      _mm512_storeu_ps(sc + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (t < n) {
      const __mmask16 mask = static_cast<__mmask16>((1u << (n - t)) - 1);
      const __m512 e = chattts_math::exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, sc + t), vm));
      _mm512_mask_storeu_ps(sc + t, mask, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
    }
    const float total = _mm512_reduce_add_ps(sum);
    __m512 acc[kMaxChunks], odd[kMaxChunks];  // two chains per chunk: one add in flight is not enough
    for (int64_t c = 0; c < chunks; ++c) acc[c] = odd[c] = _mm512_setzero_ps();
    for (t = 0; t + 2 <= n; t += 2) {
      const __m512 p0 = _mm512_set1_ps(sc[t]), p1 = _mm512_set1_ps(sc[t + 1]);
      const int8_t* vt = vc + t * d;
      for (int64_t c = 0; c < chunks; ++c) {
        acc[c] = _mm512_fmadd_ps(p0, load_i8(vt + c * 16), acc[c]);
        odd[c] = _mm512_fmadd_ps(p1, load_i8(vt + d + c * 16), odd[c]);
      }
    }
    if (t < n) {
      const __m512 p = _mm512_set1_ps(sc[t]);
      for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_fmadd_ps(p, load_i8(vc + t * d + c * 16), acc[c]);
    }
    float* o = j.out + (b * j.s + s) * hd + h * d;
    const __m512 inv = _mm512_set1_ps(1.0f / total);
    for (int64_t c = 0; c < chunks; ++c)
      _mm512_storeu_ps(o + c * 16, _mm512_mul_ps(_mm512_mul_ps(_mm512_add_ps(acc[c], odd[c]), inv),
                                                 _mm512_loadu_ps(vs + c * 16)));
  }
}

void run_task(void* data, size_t task) { attend(*static_cast<Job*>(data), static_cast<int64_t>(task)); }

struct Kernel {
  int64_t heads = 0;
  float scale = 0.0f;
};

OrtStatus* error(const std::string& msg) { return chattts_ort::invalid("Int8KvAttention: " + msg); }

OrtStatus* ORT_API_CALL compute(void* op_kernel, OrtKernelContext* ctx) {
  const Kernel& kn = *static_cast<Kernel*>(op_kernel);
  const OrtValue* in[9];
  for (size_t i = 0; i < 9; ++i) CHATTTS_RETURN_IF(api()->KernelContext_GetInput(ctx, i, &in[i]));
  std::vector<int64_t> qd, kd, vd, sd, cd, ksd, vsd;
  CHATTTS_RETURN_IF(dims_of(in[0], qd));
  CHATTTS_RETURN_IF(dims_of(in[1], kd));
  CHATTTS_RETURN_IF(dims_of(in[2], vd));
  CHATTTS_RETURN_IF(dims_of(in[3], sd));
  CHATTTS_RETURN_IF(dims_of(in[5], cd));
  CHATTTS_RETURN_IF(dims_of(in[7], ksd));
  CHATTTS_RETURN_IF(dims_of(in[8], vsd));
  if (qd.size() != 3 || qd[2] % (3 * kn.heads) != 0) return error("qkv must be [B, S, 3 x num_heads x head_dim]");
  Job j{};
  j.b = qd[0];
  j.s = qd[1];
  j.heads = kn.heads;
  j.d = qd[2] / (3 * kn.heads);
  j.scale = kn.scale;
  if (j.d % 16 != 0 || j.d > kMaxChunks * 16) return error("head_dim must be a multiple of 16, at most 256");
  if (kd.size() != 4 || kd != vd || kd[0] != j.b || kd[1] != j.heads || kd[3] != j.d)
    return error("past_key and past_value must be [B, num_heads, C, head_dim] alike");
  if (sd.size() != 1 || sd[0] != j.b) return error("seqlens_k must be [B]");
  if (cd.size() != 2 || cd[1] != j.d / 2) return error("cos_cache and sin_cache must be [positions, head_dim / 2]");
  const std::vector<int64_t> scale_dims{j.heads, 1, j.d};
  if (ksd != scale_dims || vsd != scale_dims) return error("k_scale and v_scale must be [num_heads, 1, head_dim]");
  j.past_cap = kd[2];
  const int32_t* seqlens = nullptr;
  const int32_t* total_p = nullptr;
  CHATTTS_RETURN_IF(data_of(in[3], seqlens));
  CHATTTS_RETURN_IF(data_of(in[4], total_p));
  const int64_t total = total_p[0];
  const bool first_prompt = j.past_cap == 0 || total == j.s;
  std::vector<int64_t> start(static_cast<size_t>(j.b));
  int64_t longest = 0;
  for (int64_t r = 0; r < j.b; ++r) {
    const int64_t len = static_cast<int64_t>(seqlens[r]) + 1;
    if (len > total) return error("seqlens_k[b] + 1 exceeds total_sequence_length");
    start[static_cast<size_t>(r)] = first_prompt ? 0 : len - j.s;
    if (start[static_cast<size_t>(r)] < 0) return error("a row has fewer positions than new tokens after a past");
    longest = std::max(longest, start[static_cast<size_t>(r)] + j.s);
  }
  j.cap = std::max(j.past_cap, total);
  if (longest > j.cap) return error("the new positions run past the cache");
  if (longest > cd[0]) return error("a position beyond the rotary tables");
  j.start = start.data();
  const std::vector<int64_t> out_dims{j.b, j.s, j.heads * j.d}, cache_dims{j.b, j.heads, j.cap, j.d};
  OrtValue *out = nullptr, *pk = nullptr, *pv = nullptr;
  CHATTTS_RETURN_IF(api()->KernelContext_GetOutput(ctx, 0, out_dims.data(), out_dims.size(), &out));
  CHATTTS_RETURN_IF(api()->KernelContext_GetOutput(ctx, 1, cache_dims.data(), cache_dims.size(), &pk));
  CHATTTS_RETURN_IF(api()->KernelContext_GetOutput(ctx, 2, cache_dims.data(), cache_dims.size(), &pv));
  CHATTTS_RETURN_IF(data_of(in[0], j.qkv));
  CHATTTS_RETURN_IF(data_of(in[1], j.past_k));
  CHATTTS_RETURN_IF(data_of(in[2], j.past_v));
  CHATTTS_RETURN_IF(data_of(in[5], j.cos));
  CHATTTS_RETURN_IF(data_of(in[6], j.sin));
  CHATTTS_RETURN_IF(data_of(in[7], j.ks));
  CHATTTS_RETURN_IF(data_of(in[8], j.vs));
  CHATTTS_RETURN_IF(data_of(out, j.out));
  CHATTTS_RETURN_IF(data_of(pk, j.k));
  CHATTTS_RETURN_IF(data_of(pv, j.v));
  if ((j.k == j.past_k) != (j.v == j.past_v)) return error("bind both or neither of the caches to their past");
  const int64_t tasks = j.b * j.heads;
  if (tasks == 0 || j.s == 0) return nullptr;
  if (tasks * longest * j.s < kInlineWork) {
    for (int64_t t = 0; t < tasks; ++t) attend(j, t);
    return nullptr;
  }
  return api()->KernelContext_ParallelFor(ctx, run_task, static_cast<size_t>(tasks), 0, &j);
}

OrtStatus* ORT_API_CALL create(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
  auto* kn = new Kernel();
  OrtStatus* st = api()->KernelInfoGetAttribute_int64(info, "num_heads", &kn->heads);
  if (!st) st = api()->KernelInfoGetAttribute_float(info, "scale", &kn->scale);
  if (!st && (kn->heads <= 0 || !(kn->scale > 0.0f))) st = error("num_heads and scale must be positive");
  if (st) {
    delete kn;
    return st;
  }
  *kernel = kn;
  return nullptr;
}

struct Op {
  static constexpr const char* kName = "Int8KvAttention";
  static constexpr ONNXTensorElementDataType kInputs[9] = {
      ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8,  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8,
      ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
      ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  static constexpr ONNXTensorElementDataType kOutputs[3] = {
      ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8};
  static constexpr auto create = chattts_attention::create;
  static constexpr auto compute = chattts_attention::compute;
  static void destroy(void* k) { delete static_cast<Kernel*>(k); }
};

const OrtCustomOp g_op = chattts_ort::make_op<Op>();

}  // namespace chattts_attention

// The op, for int8_matmul.cc's RegisterCustomOps (one library, one domain).
const OrtCustomOp* chattts_attention_op() { return &chattts_attention::g_op; }
