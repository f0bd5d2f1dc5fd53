// oi2jax's opt-in ggml kernel (oi2jax/quantized/ggml.py builds it; docs/performance.md): y = x @ W^T
// for W [out, in] in GGUF's raw blocks (or bf16/f16 rows), through ggml's own CPU kernels, as
// llama.cpp computes it: `from_float` converts each row of x to the kind's vec_dot_type (Q8_0,
// Q8_1, Q8_K; BF16, F16), `vec_dot` is llama.cpp's row dot product. A large product's rows are
// split over XLA's intra-op thread pool. A second function, `Attention`, is one query row's
// attention over a K/V cache (a decode step's), in llama.cpp's arithmetic.
#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <memory>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "ggml.h"
#include "ggml-cpu.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static const bool kInit = (ggml_cpu_init(), true);
static constexpr double kSplitBytes = 32.0 * (1 << 20);  // weight bytes x rows from which rows are split

// Helper threads for a decode step's small products, llama.cpp's way: its worker threads spin
// between ops, so a product of 20-100 us can be shared. XLA's pool sleeps between calls and wakes
// too late for one (docs/performance.md, "Helper threads"). `Oi2jaxGgmlSetThreads(n)` (ggml.py
// calls it when it loads the library) sets the threads a product may use, the calling one
// included: n - 1 helpers, started then. A posted product is run by every active helper,
// each claiming chunks of rows from the product's counter; one that wakes late finds none left.
// Each output row is one thread's `vec_dot`, so the result is the same whoever computes it.
static constexpr double kHelperBytes = 32.0 * 1024;  // weight bytes x rows from which helpers join
static constexpr auto kSpin = std::chrono::microseconds(300);  // a helper's spin before it sleeps

class Helpers {
 public:
  static Helpers& get() {
    static Helpers* h = new Helpers();  // never destroyed: its threads outlive static destructors
    return *h;
  }
  void set_threads(int n) {
    std::lock_guard<std::mutex> lk(m_);
    active_.store(std::max(n, 1) - 1);
    while (static_cast<int>(started_) < active_.load()) {
      const int index = started_++;
      std::thread([this, index] { loop(index); }).detach();
    }
  }
  int helpers() const { return active_.load(std::memory_order_relaxed); }
  void post(std::function<void()> work) {
    std::lock_guard<std::mutex> lk(m_);
    job_ = std::move(work);
    seq_.fetch_add(1, std::memory_order_release);
    if (sleeping_ > 0) cv_.notify_all();
  }

 private:
  void loop(int index) {
    uint64_t seen = seq_.load();
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      while (seq_.load(std::memory_order_acquire) == seen) {
#if defined(__x86_64__) || defined(__i386__)
        _mm_pause();
#endif
        if (std::chrono::steady_clock::now() - start > kSpin) {
          std::unique_lock<std::mutex> lk(m_);
          ++sleeping_;
          cv_.wait(lk, [&] { return seq_.load() != seen; });
          --sleeping_;
          break;
        }
      }
      std::function<void()> job;
      {
        std::lock_guard<std::mutex> lk(m_);
        job = job_;
        seen = seq_.load();
      }
      if (job && index < active_.load()) job();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<int> active_{0};
  int started_ = 0, sleeping_ = 0;
};

extern "C" void Oi2jaxGgmlSetThreads(int n) { Helpers::get().set_threads(n); }
extern "C" int Oi2jaxGgmlHelpers() { return Helpers::get().helpers(); }

// run(0) .. run(chunks - 1), each once, on the calling thread and on `pool_tasks` tasks of XLA's
// pool or (`helpers`) the spinning helpers: each chunk claimed from one counter. Returns when every
// chunk has run. The caller never waits on a chunk nobody claimed (that would deadlock a busy pool);
// a task or helper that starts late claims nothing, so `run` (which may refer to the caller's
// locals) is never called after this returns.
static void run_chunks(int64_t chunks, std::function<void(int64_t)> run, ffi::ThreadPool* pool, int64_t pool_tasks,
                       bool helpers) {
  struct State {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto st = std::make_shared<State>();
  auto work = [st, chunks, run] {
    for (int64_t c; (c = st->next.fetch_add(1)) < chunks;) {
      run(c);
      st->done.fetch_add(1);
    }
  };
  for (int64_t p = 0; pool != nullptr && p < pool_tasks && p + 1 < chunks; ++p) {
    auto task = work;
    pool->Schedule(std::move(task));
  }
  if (helpers && chunks > 1 && Helpers::get().helpers() > 0) Helpers::get().post(work);
  work();
  while (st->done.load() < chunks) std::this_thread::yield();
}

static ffi::Error Matvec(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                         ffi::ResultBuffer<ffi::F32> y, int64_t type) {
  (void)kInit;
  const auto t = static_cast<ggml_type>(type);
  const auto* traits = ggml_get_type_traits_cpu(t);
  const bool half = t == GGML_TYPE_BF16 || t == GGML_TYPE_F16;  // one value a block
  if (traits == nullptr || traits->vec_dot == nullptr || (ggml_blck_size(t) <= 1 && !half))
    return ffi::Error::InvalidArgument("ggml_matvec: ggml type " + std::to_string(type) + " has no CPU row dot product");
  const auto* xtraits = ggml_get_type_traits_cpu(traits->vec_dot_type);
  if (xtraits == nullptr || xtraits->from_float == nullptr)
    return ffi::Error::InvalidArgument("ggml_matvec: ggml type " + std::to_string(type) + " has no conversion of x");
  const auto xd = x.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() == 0 || yd.size() == 0)
    return ffi::Error::InvalidArgument("ggml_matvec: x and y need a last axis");
  const int64_t in = xd.back(), out = yd.back();
  if (in % ggml_blck_size(t) != 0)
    return ffi::Error::InvalidArgument("ggml_matvec: x's last axis is not a whole number of blocks");
  const int64_t rows = in > 0 ? x.element_count() / in : 0;
  const size_t wrow = ggml_row_size(t, in);
  const size_t xrow = ggml_row_size(traits->vec_dot_type, in);
  // W [..., out, wrow] with only axes of 1 before (jax.vmap's expand_dims of an unbatched weight)
  if (static_cast<size_t>(w.element_count()) != static_cast<size_t>(out) * wrow)
    return ffi::Error::InvalidArgument("ggml_matvec: the weight is not [out, in] in this type's blocks "
                                       "(a weight batched under vmap is not supported)");
  if (rows == 0 || out == 0) return ffi::Error::Success();
  std::vector<uint8_t> xq(xrow * rows);
  for (int64_t r = 0; r < rows; ++r) xtraits->from_float(x.typed_data() + r * in, xq.data() + r * xrow, in);
  // W's rows are split over XLA's pool for a large product (several rows of a large weight); a
  // smaller one from 32 KB over the spinning helpers: inside a decode step the pool's other
  // thread sleeps between calls and joins too late to help (docs/performance.md). W's rows in one
  // contiguous part per thread that may join (a multiple of 16 rows: no two threads write one
  // 64-byte line of y): each thread streams its own part of W, as llama.cpp's decode splits a product
  // by thread; chunks of 16 rows claimed in turn measured 20-25% slower (docs/performance.md)
  const double bytes = static_cast<double>(out) * wrow * rows;
  const bool large = bytes >= kSplitBytes, shared = !large && bytes >= kHelperBytes;
  const int64_t threads = 1 + (large ? pool.num_threads() : shared ? Helpers::get().helpers() : 0);
  const int64_t chunk = (((out + threads - 1) / threads + 15) / 16) * 16, chunks = (out + chunk - 1) / chunk;
  const uint8_t* wp = w.typed_data();
  const uint8_t* xp = xq.data();
  float* yp = y->typed_data();
  auto rows_of = [chunk, out, rows, in, wrow, xrow, wp, xp, yp, traits](int64_t c) {
    for (int64_t o = c * chunk; o < std::min(out, (c + 1) * chunk); ++o)
      for (int64_t r = 0; r < rows; ++r)
        traits->vec_dot(in, yp + r * out + o, 0, wp + o * wrow, 0, xp + r * xrow, 0, 1);
  };
  run_chunks(chunks, rows_of, &pool, large ? pool.num_threads() : 0, shared);
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Oi2jaxGgmlMatvec, Matvec,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("type"));

// `n` values of a table row in f32: the row itself (f32), or widened into `buf` (f16, bf16)
static const float* widen(ggml_type t, const uint8_t* src, float* buf, int64_t n) {
  if (t == GGML_TYPE_F16)
    ggml_cpu_fp16_to_fp32(reinterpret_cast<const ggml_fp16_t*>(src), buf, n);
  else if (t == GGML_TYPE_BF16)
    ggml_bf16_to_fp32_row(reinterpret_cast<const ggml_bf16_t*>(src), buf, n);
  else
    return reinterpret_cast<const float*>(src);
  return buf;
}

// each row of s [rows, len] to exp(s - its max) in place, its sum to `sums`
static void softmax_rows(float* s, int64_t rows, int64_t len, float* sums) {
  for (int64_t i = 0; i < rows; ++i) {
    float* si = s + i * len;
    float top = -INFINITY;
    for (int64_t p = 0; p < len; ++p) top = std::max(top, si[p]);
    float total = 0;
    for (int64_t p = 0; p < len; ++p) total += (si[p] = std::exp(si[p] - top));
    sums[i] = total;
  }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// The AVX2 form of the handler's attention (docs/performance.md, "Attention through ggml"), for HD a
// multiple of 64. What sets its speed is the memory walk: the filled rows are read in memory order,
// in blocks of 8 (scores) and 32 (values) positions, the next block prefetched, each K and V row
// widened to f32 once for the G query heads that share it. Scores: 8 positions' dot products summed
// across lanes at once; softmax with an 8-lane exp; the weighted V sum in registers per block.
static constexpr int64_t kMaxHeads = 128;  // query heads of one row the fast form takes (scratch on the stack)
static constexpr int64_t kChunk = 64;  // positions a chunk: the unit of work the helper threads share

struct LoadF16 {
  static __m256 at(const uint8_t* row, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i * 2)));
  }
};
struct LoadBF16 {
  static __m256 at(const uint8_t* row, int64_t i) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i * 2))), 16));
  }
};
struct LoadF32 {
  static __m256 at(const uint8_t* row, int64_t i) { return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i); }
};

// exp(x) of 8 lanes for x <= 0 (a score minus its row's max): x = k ln2 + r with |r| <= ln2/2 (Cody
// and Waite's two-constant reduction), exp(r) by Cephes' degree-6 polynomial for expf, times 2^k;
// within 1.3 ulp of exp on [-87, 0] (measured). x below -87.33 (exp under f32's normal range) gives
// 0, -inf gives 0, NaN stays NaN.
static inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(lo, x);  // NaN passes (max returns its second operand when one is NaN)
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// lane i of the result: the sum of the 8 lanes of a[i]
static inline __m256 sum_lanes8(const float* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_load_ps(a), _mm256_load_ps(a + 8));
  const __m256 t1 = _mm256_hadd_ps(_mm256_load_ps(a + 16), _mm256_load_ps(a + 24));
  const __m256 t2 = _mm256_hadd_ps(_mm256_load_ps(a + 32), _mm256_load_ps(a + 40));
  const __m256 t3 = _mm256_hadd_ps(_mm256_load_ps(a + 48), _mm256_load_ps(a + 56));
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

static inline void prefetch_rows(const uint8_t* base, int64_t from, int64_t to, int64_t len, size_t pitch) {
  to = std::min(to, len);
  if (from >= to) return;
  for (const uint8_t *a = base + from * pitch, *b = base + to * pitch; a < b; a += 64) _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
}

// out[j] += sum over positions p0..p1-1 of w[j][p] V[p] for GJ query heads j of KV head h; their
// sums over one block kept in registers, 32 values at a time
template <class Load, int GJ>
static void weighted_rows(const uint8_t* vh, size_t pitch, int64_t hd, const float* w, int64_t len, int64_t p0, int64_t p1, float* out) {
  for (int64_t c0 = 0; c0 < hd; c0 += 32) {
    __m256 acc[GJ][4];
    for (int j = 0; j < GJ; ++j)
      for (int c = 0; c < 4; ++c) acc[j][c] = _mm256_setzero_ps();
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* v = vh + p * pitch;
      const __m256 v0 = Load::at(v, c0), v1 = Load::at(v, c0 + 8), v2 = Load::at(v, c0 + 16), v3 = Load::at(v, c0 + 24);
      for (int j = 0; j < GJ; ++j) {
        const __m256 wj = _mm256_broadcast_ss(w + j * len + p);
        acc[j][0] = _mm256_fmadd_ps(wj, v0, acc[j][0]);
        acc[j][1] = _mm256_fmadd_ps(wj, v1, acc[j][1]);
        acc[j][2] = _mm256_fmadd_ps(wj, v2, acc[j][2]);
        acc[j][3] = _mm256_fmadd_ps(wj, v3, acc[j][3]);
      }
    }
    for (int j = 0; j < GJ; ++j)
      for (int c = 0; c < 4; ++c) {
        float* o = out + j * hd + c0 + c * 8;
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), acc[j][c]));
      }
  }
}

// q [KVH, G, HD] (f32, already rounded as the handler rounds it); K and V: the first of `len` rows of
// the layer's table; s [heads, len] scratch; o [heads, HD] zeroed: the sums of the V rows weighted by
// exp(score - tops[i]), sums[i] the sum of those weights, tops[i] head i's largest score
template <class Load>
static void attention_avx2(const float* q, const uint8_t* K, const uint8_t* V, int64_t kvh, int64_t g, int64_t hd, int64_t len,
                           size_t pitch, float scale, float cap, float* s, float* sums, float* o, float* tops) {
  const int64_t heads = kvh * g;
  const size_t hpitch = pitch / kvh;  // bytes from one KV head's part of a row to the next
  alignas(32) float part[kMaxHeads * 64];  // [head][position of the block][8 lanes]
  const __m256 sc = _mm256_set1_ps(scale);
  prefetch_rows(K, 0, 16, len, pitch);
  for (int64_t p = 0; p < len; p += 8) {
    const int64_t rows = std::min<int64_t>(8, len - p);
    prefetch_rows(K, p + 16, p + 24, len, pitch);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < kvh; ++h) {
        const uint8_t* k = K + (p + r) * pitch + h * hpitch;
        for (int64_t c0 = 0; c0 < hd; c0 += 64) {
          const __m256 k0 = Load::at(k, c0), k1 = Load::at(k, c0 + 8), k2 = Load::at(k, c0 + 16), k3 = Load::at(k, c0 + 24),
                       k4 = Load::at(k, c0 + 32), k5 = Load::at(k, c0 + 40), k6 = Load::at(k, c0 + 48), k7 = Load::at(k, c0 + 56);
          for (int64_t j = 0; j < g; ++j) {
            const float* a = q + (h * g + j) * hd + c0;
            __m256 x = _mm256_mul_ps(_mm256_loadu_ps(a), k0), y = _mm256_mul_ps(_mm256_loadu_ps(a + 8), k1);
            x = _mm256_fmadd_ps(_mm256_loadu_ps(a + 16), k2, x);
            y = _mm256_fmadd_ps(_mm256_loadu_ps(a + 24), k3, y);
            x = _mm256_fmadd_ps(_mm256_loadu_ps(a + 32), k4, x);
            y = _mm256_fmadd_ps(_mm256_loadu_ps(a + 40), k5, y);
            x = _mm256_fmadd_ps(_mm256_loadu_ps(a + 48), k6, x);
            y = _mm256_fmadd_ps(_mm256_loadu_ps(a + 56), k7, y);
            float* dst = part + ((h * g + j) * 8 + r) * 8;
            const __m256 xy = _mm256_add_ps(x, y);
            _mm256_store_ps(dst, c0 == 0 ? xy : _mm256_add_ps(_mm256_load_ps(dst), xy));
          }
        }
      }
    for (int64_t r = rows; r < 8; ++r)
      for (int64_t i = 0; i < heads; ++i) _mm256_store_ps(part + (i * 8 + r) * 8, _mm256_setzero_ps());
    for (int64_t i = 0; i < heads; ++i) {
      alignas(32) float d[8];
      _mm256_store_ps(d, _mm256_mul_ps(sum_lanes8(part + i * 64), sc));
      for (int64_t r = 0; r < rows; ++r) s[i * len + p + r] = cap > 0 ? std::tanh(d[r] / cap) * cap : d[r];
    }
  }
  prefetch_rows(V, 0, 32, len, pitch);
  for (int64_t i = 0; i < heads; ++i) {  // softmax numerators in place, their sums
    float* si = s + i * len;
    float top = -INFINITY;
    int64_t p = 0;
    if (len >= 8) {
      __m256 m8 = _mm256_loadu_ps(si);
      for (p = 8; p + 8 <= len; p += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(si + p));
      alignas(32) float m[8];
      _mm256_store_ps(m, m8);
      for (int c = 0; c < 8; ++c) top = std::max(top, m[c]);
    }
    for (; p < len; ++p) top = std::max(top, si[p]);
    const __m256 t8 = _mm256_set1_ps(top);
    __m256 acc = _mm256_setzero_ps();
    for (p = 0; p + 8 <= len; p += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(si + p), t8));
      _mm256_storeu_ps(si + p, e);
      acc = _mm256_add_ps(acc, e);
    }
    alignas(32) float a8[8];
    _mm256_store_ps(a8, acc);
    float total = 0;
    for (int c = 0; c < 8; ++c) total += a8[c];
    if (p < len) {
      alignas(32) float tail[8] = {0};
      for (int64_t r = p; r < len; ++r) tail[r - p] = si[r] - top;
      _mm256_store_ps(tail, exp8(_mm256_load_ps(tail)));
      for (int64_t r = p; r < len; ++r) total += (si[r] = tail[r - p]);
    }
    sums[i] = total;
    tops[i] = top;
  }
  constexpr int64_t kBlock = 32;
  for (int64_t p0 = 0; p0 < len; p0 += kBlock) {
    const int64_t p1 = std::min(p0 + kBlock, len);
    prefetch_rows(V, p0 + kBlock, p0 + 2 * kBlock, len, pitch);
    for (int64_t h = 0; h < kvh; ++h)
      for (int64_t j = 0; j < g; j += 3) {
        const uint8_t* vh = V + h * hpitch;
        const float* w = s + (h * g + j) * len;
        float* out = o + (h * g + j) * hd;
        switch (std::min<int64_t>(3, g - j)) {
          case 1: weighted_rows<Load, 1>(vh, pitch, hd, w, len, p0, p1, out); break;
          case 2: weighted_rows<Load, 2>(vh, pitch, hd, w, len, p0, p1, out); break;
          default: weighted_rows<Load, 3>(vh, pitch, hd, w, len, p0, p1, out); break;
        }
      }
  }
}
#endif

// Attention of one query row over the filled rows lo..n-1 of a K/V table [L, T, KVH, HD] in f32,
// f16 or bf16, in llama.cpp's arithmetic for a decode step's attention:
// each query head rounded to the table's type (`from_float`, llama.cpp's vec_dot_type), its scores
// the f32 dot products with the rows of its KV head (widened to f32 exactly), times `scale`,
// soft-capped when `softcap` > 0; the softmax and the weighted sum of the V rows in f32.
// Each K and V row is read once for the G query heads that share it. `attend` is one row's (the
// handler below runs it for each row of a batch): qsrc and o [KVH, G, HD]; kbase / vbase one
// slot's tables [layers, rows, KVH, HD] of type t; m = (layer, lo, n), clamped here so a bad one
// never reads outside the table; f = (scale, softcap).
static void attend(ggml_type t, const float* qsrc, const uint8_t* kbase, const uint8_t* vbase, int64_t layers,
                   int64_t rows, int64_t kvh, int64_t g, int64_t hd, const int32_t* m, const float* f, float* o) {
  const int64_t layer = std::clamp<int64_t>(m[0], 0, layers - 1);
  const int64_t n = std::clamp<int64_t>(m[2], 0, rows), lo = std::clamp<int64_t>(m[1], 0, n), len = n - lo;
  const float scale = f[0], cap = f[1];
  const auto* traits = ggml_get_type_traits_cpu(t);
  const auto* qtraits = ggml_get_type_traits_cpu(traits->vec_dot_type);
  const size_t qrow = ggml_row_size(traits->vec_dot_type, hd), esize = ggml_type_size(t);
  const size_t pitch = static_cast<size_t>(kvh * hd) * esize;  // bytes from one position's row to the next
  const auto* kp = kbase + static_cast<size_t>(layer * rows) * pitch;
  const auto* vp = vbase + static_cast<size_t>(layer * rows) * pitch;
  // the rows are read in memory order, all KV heads of a position at once (a strided walk over
  // one head's rows at a time measured 2-3x slower: each row a cache miss the prefetcher missed);
  // a position's K row widened to f32 once, then the G query heads' dots of each KV head. With
  // AVX2, HD a multiple of 64: attention_avx2 above; otherwise the plain loops below.
  const int64_t heads = kvh * g;  // query heads, [KVH, G] order
  std::vector<float> qs(heads * hd), sums(heads);
  for (int64_t i = 0; i < heads * hd; ++i) qs[i] = qsrc[i];
  if (t != GGML_TYPE_F32) {  // rounded to the table's type, as llama.cpp's vec_dot_type
    std::vector<uint8_t> qv(qrow);
    for (int64_t i = 0; i < heads; ++i) {
      qtraits->from_float(qs.data() + i * hd, qv.data(), hd);
      widen(t, qv.data(), qs.data() + i * hd, hd);
    }
  }
  std::fill(o, o + heads * hd, 0.0f);
  // scores s [heads, len]: head i's row contiguous for the softmax
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (hd % 64 == 0 && heads <= kMaxHeads) {
    // the rows in chunks of kChunk positions, each chunk's softmax against its own max, merged in
    // chunk order: the same arithmetic whoever runs a chunk (the caller or a spinning helper), so
    // the result does not depend on the threads
    const int64_t chunks = (len + kChunk - 1) / kChunk;
    std::vector<float> tops(chunks * heads), csums(chunks * heads), co(chunks * heads * hd, 0.0f);
    const float* qp = qs.data();
    auto chunk = [&, qp](int64_t c) {
      const int64_t r0 = c * kChunk, rows_c = std::min(len, r0 + kChunk) - r0;
      std::vector<float> sc(static_cast<size_t>(heads * rows_c));
      const uint8_t *kc = kp + (lo + r0) * pitch, *vc = vp + (lo + r0) * pitch;
      float *sm = csums.data() + c * heads, *oc = co.data() + c * heads * hd, *tc = tops.data() + c * heads;
      switch (t) {
        case GGML_TYPE_F16: attention_avx2<LoadF16>(qp, kc, vc, kvh, g, hd, rows_c, pitch, scale, cap, sc.data(), sm, oc, tc); break;
        case GGML_TYPE_BF16: attention_avx2<LoadBF16>(qp, kc, vc, kvh, g, hd, rows_c, pitch, scale, cap, sc.data(), sm, oc, tc); break;
        default: attention_avx2<LoadF32>(qp, kc, vc, kvh, g, hd, rows_c, pitch, scale, cap, sc.data(), sm, oc, tc); break;
      }
    };
    // one contiguous run of chunks per thread that may join, as a product's rows (Matvec)
    const int64_t threads = 1 + Helpers::get().helpers(), per = (chunks + threads - 1) / threads;
    run_chunks((chunks + per - 1) / std::max<int64_t>(per, 1), [&](int64_t part) {
      for (int64_t c = part * per; c < std::min(chunks, (part + 1) * per); ++c) chunk(c);
    }, nullptr, 0, true);
    for (int64_t i = 0; i < heads; ++i) {
      float top = -INFINITY;
      for (int64_t c = 0; c < chunks; ++c) top = std::max(top, tops[c * heads + i]);
      float total = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        const float f = std::exp(tops[c * heads + i] - top);
        total += csums[c * heads + i] * f;
        const float* oc = co.data() + (c * heads + i) * hd;
        for (int64_t d = 0; d < hd; ++d) o[i * hd + d] += oc[d] * f;
      }
      sums[i] = total;
    }
  } else
#endif
  {
    std::vector<float> row(kvh * hd), s(static_cast<size_t>(heads * len));  // the plain loops' scratch
    for (int64_t p = 0; p < len; ++p) {
      const float* kf = widen(t, kp + (lo + p) * pitch, row.data(), kvh * hd);
      for (int64_t i = 0; i < heads; ++i) {
        const float* a = qs.data() + i * hd;
        const float* b = kf + (i / g) * hd;
        float x = 0;
        for (int64_t d = 0; d < hd; ++d) x += a[d] * b[d];
        x *= scale;
        s[i * len + p] = cap > 0 ? std::tanh(x / cap) * cap : x;
      }
    }
    softmax_rows(s.data(), heads, len, sums.data());
    for (int64_t p = 0; p < len; ++p) {
      const float* vf = widen(t, vp + (lo + p) * pitch, row.data(), kvh * hd);
      for (int64_t i = 0; i < heads; ++i) {
        const float w = s[i * len + p];
        const float* vh = vf + (i / g) * hd;
        float* oi = o + i * hd;
        for (int64_t d = 0; d < hd; ++d) oi[d] += w * vh[d];
      }
    }
  }
  for (int64_t i = 0; i < heads; ++i)
    for (int64_t d = 0; d < hd; ++d) o[i * hd + d] /= sums[i];  // 0 / 0 = NaN where no row is read
}

// The handler: `attend` for each row of a batch. q and out [..., KVH, G, HD]; k and v [..., L, T,
// KVH, HD] (ggml.py gives a single table L = 1); meta i32 [..., 3] = (layer, lo, n), runtime values
// (the caller's guards check them; clamped here so a bad one never reads outside the table);
// factors f32 [..., 2] = (scale, softcap). The axes before those are a batch (jax.vmap's, with
// vmap_method="expand_dims": every operand has them, an unbatched one with size 1, broadcast), so a
// batch's slots read their own tables in place, never a copy of one.
static ffi::Error Attention(ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::S32> meta,
                           ffi::Buffer<ffi::F32> factors, ffi::ResultBuffer<ffi::F32> out) {
  (void)kInit;
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = meta.dimensions(),
             fd = factors.dimensions();
  if (qd.size() < 3)
    return ffi::Error::InvalidArgument("ggml_attention: q must be [..., KVH, G, HD]");
  const size_t nb = qd.size() - 3;  // batch axes
  if (kd.size() != nb + 4 || vd.size() != nb + 4 || md.size() != nb + 1 || fd.size() != nb + 1 ||
      k.element_type() != v.element_type())
    return ffi::Error::InvalidArgument("ggml_attention: k and v must be tables [..., L, T, KVH, HD] of one type, meta "
                                       "[..., 3] and factors [..., 2], with q's batch axes");
  ggml_type t;
  switch (k.element_type()) {
    case ffi::DataType::F32: t = GGML_TYPE_F32; break;
    case ffi::DataType::F16: t = GGML_TYPE_F16; break;
    case ffi::DataType::BF16: t = GGML_TYPE_BF16; break;
    default: return ffi::Error::InvalidArgument("ggml_attention: the table must be f32, f16 or bf16");
  }
  const int64_t layers = kd[nb], rows = kd[nb + 1], kvh = kd[nb + 2], hd = kd[nb + 3], g = qd[nb + 1];
  if (rows == 0 || kvh == 0 || hd == 0 || qd[nb] != kvh || qd[nb + 2] != hd || md[nb] != 3 || fd[nb] != 2 ||
      out->element_count() != q.element_count())
    return ffi::Error::InvalidArgument("ggml_attention: q and out must be [..., KVH, G, HD] of the table's KVH and HD");
  for (size_t a = 0; a < nb; ++a)
    for (auto d : {kd[a], vd[a], md[a], fd[a]})
      if (d != qd[a] && d != 1)
        return ffi::Error::InvalidArgument("ggml_attention: a batch axis of k, v, meta or factors is neither q's nor 1");
  for (size_t a = 0; a < 4; ++a)
    if (vd[nb + a] != kd[nb + a])
      return ffi::Error::InvalidArgument("ggml_attention: k and v must have one shape");
  int64_t batch = 1;
  for (size_t a = 0; a < nb; ++a) batch *= qd[a];
  const size_t table = static_cast<size_t>(layers * rows * kvh * hd) * ggml_type_size(t), row = kvh * g * hd;
  const auto* kb = static_cast<const uint8_t*>(k.untyped_data());
  const auto* vb = static_cast<const uint8_t*>(v.untyped_data());
  for (int64_t b = 0; b < batch; ++b) {
    // b's index in each operand: q's batch index with the operand's axes of 1 at 0
    int64_t ki = 0, vi = 0, mi = 0, fi = 0;
    for (size_t a = 0, rest = b; a < nb; ++a) {
      int64_t stride = 1;
      for (size_t c = a + 1; c < nb; ++c) stride *= qd[c];
      const int64_t at = static_cast<int64_t>(rest) / stride;
      rest %= stride;
      ki = ki * kd[a] + (kd[a] == 1 ? 0 : at);
      vi = vi * vd[a] + (vd[a] == 1 ? 0 : at);
      mi = mi * md[a] + (md[a] == 1 ? 0 : at);
      fi = fi * fd[a] + (fd[a] == 1 ? 0 : at);
    }
    attend(t, q.typed_data() + b * row, kb + ki * table, vb + vi * table, layers, rows, kvh, g, hd,
           meta.typed_data() + mi * 3, factors.typed_data() + fi * 2, out->typed_data() + b * row);
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Oi2jaxGgmlAttention, Attention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
