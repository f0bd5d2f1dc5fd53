// oi2jax's opt-in ggml kernel (oi2jax/quantized/ggml.py builds it; docs/performance.md): y = x @ W^T
// for W [out, in] in GGUF's raw blocks (or bf16/f16 rows), through ggml's own CPU kernels, as
// llama.cpp computes it: `from_float` converts each row of x to the kind's vec_dot_type (Q8_0,
// Q8_1, Q8_K; BF16, F16), `vec_dot` is llama.cpp's row dot product. A large product's rows are
// split over XLA's intra-op thread pool.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ggml.h"
#include "ggml-cpu.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static const bool kInit = (ggml_cpu_init(), true);
static constexpr double kSplitBytes = 32.0 * (1 << 20);  // weight bytes x rows from which rows are split

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
  // chunks of W's rows claimed from one counter by the caller and by helper tasks; the caller
  // never waits on a task that has not started (that would deadlock a busy pool), only on claimed chunks
  struct State {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto st = std::make_shared<State>();
  const int64_t chunk = 16, chunks = (out + chunk - 1) / chunk;
  const uint8_t* wp = w.typed_data();
  const uint8_t* xp = xq.data();
  float* yp = y->typed_data();
  auto work = [st, chunks, chunk, out, rows, in, wrow, xrow, wp, xp, yp, traits] {
    for (int64_t c; (c = st->next.fetch_add(1)) < chunks;) {
      for (int64_t o = c * chunk; o < std::min(out, (c + 1) * chunk); ++o)
        for (int64_t r = 0; r < rows; ++r)
          traits->vec_dot(in, yp + r * out + o, 0, wp + o * wrow, 0, xp + r * xrow, 0, 1);
      st->done.fetch_add(1);
    }
  };
  // W's rows are split over XLA's pool only for a large product (several rows of a large weight):
  // inside a decode step the pool's other thread sleeps between calls and joins too late to help
  // a small one, and the same step measured faster unsplit (docs/performance.md)
  const int64_t helpers = static_cast<double>(out) * wrow * rows >= kSplitBytes ? pool.num_threads() : 0;
  for (int64_t p = 0; p < helpers && p + 1 < chunks; ++p) {
    auto task = work;
    pool.Schedule(std::move(task));
  }
  work();
  while (st->done.load() < chunks) std::this_thread::yield();
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Oi2jaxGgmlMatvec, Matvec,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("type"));
