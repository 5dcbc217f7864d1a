// The primitives' CPU evaluation: activations quantized per row, the ISA's kernel run over
// tiles split among the threads (one contiguous range of output features each), and the
// row dequantizer for embedding lookups.
#include "ops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "repack.h"
#include "layout.h"
#include "fkernel.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MLXCEL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#define MLXCEL_PAUSE() asm volatile("yield")
#else
#define MLXCEL_PAUSE()
#endif

namespace mlxcel_q {

namespace {

// ----------------------------------------------------------------------------- threads
// Workers spin briefly after a call (the next matmul of a step usually follows within tens of
// microseconds), then sleep on a condition variable, so an idle server costs nothing.
class Pool {
 public:
  explicit Pool(int threads) : threads_(std::max(1, threads)) {
    const char* spin = std::getenv("MLXCEL_SPIN_US");
    spin_us_ = spin ? std::atoi(spin) : 200;
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  // fn(part, parts) for part = 0 .. threads-1; returns when all are done.
  void run(const std::function<void(int, int)>& fn) {
    if (threads_ == 1) {
      fn(0, 1);
      return;
    }
    job_ = &fn;
    done_.store(0, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> g(mu_);
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    fn(0, threads_);
    // Spin briefly, then yield: on oversubscribed cores a worker may be descheduled, and a caller
    // spinning through its time slice would only keep it off the core (2 threads on two loaded
    // cores decoded at a tenth of one thread's speed before).
    for (int spins = 0; done_.load(std::memory_order_acquire) != threads_ - 1; ++spins) {
      if (spins < 4096) MLXCEL_PAUSE();
      else std::this_thread::yield();
    }
  }

 private:
  void loop(int index) {
    uint64_t seen = 0;  // the generation at construction: a job posted before this thread ran is not missed
    while (true) {
      auto start = std::chrono::steady_clock::now();
      int spins = 0;
      while (gen_.load(std::memory_order_acquire) == seen) {
        MLXCEL_PAUSE();
        if (++spins % 256 == 0) std::this_thread::yield();
        if (spins % 256 == 0 &&
            std::chrono::steady_clock::now() - start > std::chrono::microseconds(spin_us_)) {
          std::unique_lock<std::mutex> lk(mu_);
          cv_.wait(lk, [&] { return gen_.load() != seen; });
          break;
        }
      }
      seen = gen_.load(std::memory_order_acquire);
      if (stop_) return;
      (*job_)(index, threads_);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  int threads_;
  int spin_us_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> done_{0};
  const std::function<void(int, int)>* job_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

std::mutex g_config_mu;
std::unique_ptr<Pool> g_pool;
int g_threads = 1;

Pool& pool() {
  std::lock_guard<std::mutex> g(g_config_mu);
  if (!g_pool || g_pool->threads() != g_threads) {
    g_pool.reset();
    g_pool = std::make_unique<Pool>(g_threads);
  }
  return *g_pool;
}

// ----------------------------------------------------------------------------- ISA
using Kernel = void (*)(const Layout&, const uint8_t*, int, int, const XQuant&, int, float*, int, int);

bool has(const char* name) {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (!std::strcmp(name, "avx512_vnni"))
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  if (!std::strcmp(name, "avx2"))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
#if defined(__aarch64__)
  if (!std::strcmp(name, "neon")) return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;  // sdot
#endif
  return !std::strcmp(name, "scalar");
}

Kernel kernel_for(const std::string& name) {
#if defined(__x86_64__) || defined(_M_X64)
  if (name == "avx512_vnni") return avx512::matmul;
  if (name == "avx2") return avx2::matmul;
#endif
#if defined(__aarch64__)
  if (name == "neon") return neon::matmul;
#endif
  return scalar::matmul;
}

std::string best_isa() {
  for (const char* name : {"avx512_vnni", "avx2", "neon"})
    if (has(name)) return name;
  return "scalar";
}

std::string g_isa = best_isa();
Kernel g_kernel = kernel_for(g_isa);
FloatKernel g_fkernel = float_kernel_for(g_isa);

// ----------------------------------------------------------------------------- activations
struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> s;
  std::vector<float> ds;
};

// One block of 32 activations: d = max|x| / 127, q = round-half-even(x * 127 / max|x|) (MXCSR's
// default mode, as nearbyint), sums of q over each half. The vector version gives the same bits.
inline void quantize_block(const float* xb, int8_t* q, float* d_out, int32_t* lo_out, int32_t* hi_out) {
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
  const float d = amax / 127.f;
  const float id = d > 0.f ? 127.f / amax : 0.f;
  int32_t lo = 0, hi = 0;
  for (int j = 0; j < 32; ++j) {
    int v = int(std::nearbyint(xb[j] * id));
    v = std::min(127, std::max(-127, v));
    q[j] = int8_t(v);
    (j < 16 ? lo : hi) += v;
  }
  *d_out = d;
  *lo_out = lo;
  *hi_out = hi;
}

#if defined(__x86_64__) || defined(_M_X64)
__attribute__((target("avx512f,avx512bw"))) void quantize_block_avx512(const float* xb, int8_t* q, float* d_out,
                                                                       int32_t* lo_out, int32_t* hi_out) {
  const __m512 a = _mm512_loadu_ps(xb), b = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float d = amax / 127.f;
  const float id = d > 0.f ? 127.f / amax : 0.f;
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
  __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vid));  // rounds half to even under the default MXCSR
  __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vid));
  qa = _mm512_max_epi32(nlim, _mm512_min_epi32(lim, qa));
  qb = _mm512_max_epi32(nlim, _mm512_min_epi32(lim, qb));
  _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtepi32_epi8(qb));
  *d_out = d;
  *lo_out = _mm512_reduce_add_epi32(qa);
  *hi_out = _mm512_reduce_add_epi32(qb);
}
#endif

// The AVX-512 quantizer goes with the AVX-512 kernel, so that comparing the ISAs' results (the
// tests do) compares the quantizers too.
bool vector_quantizer() {
#if defined(__x86_64__) || defined(_M_X64)
  return g_kernel == avx512::matmul;
#else
  return false;
#endif
}

void quantize_rows(const float* x, int m, int k, Scratch& sc) {
  const int nb = k / 32;
  sc.q.resize(size_t(m) * k);
  sc.d.resize(size_t(m) * nb);
  sc.s.resize(size_t(m) * nb * 2);
  sc.ds.resize(size_t(m) * nb * 3);
  const bool vec = vector_quantizer();
  for (int r = 0; r < m; ++r)
    for (int b = 0; b < nb; ++b) {
      const size_t i = size_t(r) * nb + b;
      const float* xb = x + size_t(r) * k + b * 32;
      int8_t* q = sc.q.data() + size_t(r) * k + b * 32;
      int32_t lo, hi;
      float d;
#if defined(__x86_64__) || defined(_M_X64)
      if (vec) quantize_block_avx512(xb, q, &d, &lo, &hi);
      else
#endif
        quantize_block(xb, q, &d, &lo, &hi);
      sc.d[i] = d;
      sc.s[2 * i] = lo;
      sc.s[2 * i + 1] = hi;
      float* ds = sc.ds.data() + 3 * i;
      ds[0] = d * float(lo);
      ds[1] = d * float(hi);
      ds[2] = d * float(lo + hi);
    }
}

// The rows of a strided x (a transposed view read in place) gathered: one copy per run of the
// last axis when that axis is contiguous, element by element otherwise.
void gather_rows(const float* xp, const mx::Shape& shape, const mx::Strides& strides, size_t count,
                 std::vector<float>& out) {
  out.resize(count);
  const int last = shape.empty() ? 1 : shape.back();
  if (!shape.empty() && strides.back() == 1 && last > 0) {
    for (size_t i = 0; i < count; i += last)
      std::memcpy(out.data() + i, xp + mx::elem_to_loc(int64_t(i), shape, strides), sizeof(float) * last);
    return;
  }
  for (size_t i = 0; i < count; ++i) out[i] = xp[mx::elem_to_loc(int64_t(i), shape, strides)];
}

// The m rows of x (gathered first when strided) quantized into this thread's scratch, which the
// returned view points into until the thread's next call: what both matmul primitives start with.
static XQuant quantized_input(const float* xp, int m, int k, bool strided, const mx::Shape& shape,
                              const mx::Strides& strides) {
  static thread_local Scratch sc;
  static thread_local std::vector<float> gathered;
  const float* rows = xp;
  if (strided) {
    gather_rows(xp, shape, strides, size_t(m) * k, gathered);
    rows = gathered.data();
  }
  quantize_rows(rows, m, k, sc);
  return XQuant{sc.q.data(), sc.d.data(), sc.s.data(), sc.ds.data(), k};
}

// The m rows of x as contiguous floats (gathered into this thread's scratch when strided): what the
// float kernel reads.
static const float* float_input(const float* xp, int m, int k, bool strided, const mx::Shape& shape,
                                const mx::Strides& strides) {
  static thread_local std::vector<float> gathered;
  if (!strided) return xp;
  gather_rows(xp, shape, strides, size_t(m) * k, gathered);
  return gathered.data();
}

void check_packed(const mx::array& packed, int type, int group, int n, int k) {
  Layout l = layout_of(type, group);
  if (k % l.group) throw std::invalid_argument("k is not a multiple of the packed type's block");
  if (packed.dtype() != mx::uint8 || packed.nbytes() != packed_bytes(l, n, k))
    throw std::invalid_argument("packed weight has the wrong size for its type and shape");
}

}  // namespace

// ----------------------------------------------------------------------------- configuration
void set_num_threads(int n) {
  std::lock_guard<std::mutex> g(g_config_mu);
  g_threads = std::max(1, n);
}

int num_threads() { return g_threads; }

std::string isa() { return g_isa; }

std::string available_isas() {
  std::string out;
  for (const char* name : {"avx512_vnni", "avx2", "neon", "scalar"})
    if (has(name)) out += (out.empty() ? "" : ",") + std::string(name);
  return out;
}

void set_isa(const std::string& name) {
  std::string want = name == "auto" ? best_isa() : name;
  if (!has(want.c_str())) throw std::invalid_argument("ISA not available on this CPU: " + name);
  g_isa = want;
  g_kernel = kernel_for(want);
  g_fkernel = float_kernel_for(want);
}

// ----------------------------------------------------------------------------- ops
mx::array qmatmul(const mx::array& x, const mx::array& packed, int type, int group, int n, int k) {
  check_packed(packed, type, group, n, k);
  if (x.ndim() < 1 || x.shape(-1) != k) throw std::invalid_argument("qmatmul: x's last axis must be k");
  auto s = mx::default_stream(mx::Device::cpu);
  auto xf = x.dtype() == mx::float32 ? x : mx::astype(x, mx::float32, s);  // strided rows are gathered in eval
  mx::Shape shape = x.shape();
  shape.back() = n;
  auto out = mx::array(shape, mx::float32, std::make_shared<QMatmul>(s, type, group, n, k), {xf, packed});
  return x.dtype() == mx::float32 ? out : mx::astype(out, x.dtype(), s);
}

std::vector<mx::array> qmatmul_multi(const mx::array& x, const std::vector<mx::array>& packed,
                                     const std::vector<int>& types, const std::vector<int>& groups,
                                     const std::vector<int>& ns, int k) {
  const size_t count = packed.size();
  if (count == 0 || types.size() != count || groups.size() != count || ns.size() != count)
    throw std::invalid_argument("qmatmul_multi: one type, group and n per packed matrix");
  for (size_t i = 0; i < count; ++i) check_packed(packed[i], types[i], groups[i], ns[i], k);
  if (x.ndim() < 1 || x.shape(-1) != k) throw std::invalid_argument("qmatmul_multi: x's last axis must be k");
  auto s = mx::default_stream(mx::Device::cpu);
  auto xf = x.dtype() == mx::float32 ? x : mx::astype(x, mx::float32, s);
  std::vector<mx::Shape> shapes;
  for (int n : ns) {
    mx::Shape shape = x.shape();
    shape.back() = n;
    shapes.push_back(shape);
  }
  std::vector<mx::array> inputs{xf};
  inputs.insert(inputs.end(), packed.begin(), packed.end());
  auto outs = mx::array::make_arrays(shapes, std::vector<mx::Dtype>(count, mx::float32),
                                     std::make_shared<QMatmulMulti>(s, types, groups, ns, k), inputs);
  if (x.dtype() != mx::float32)
    for (auto& o : outs) o = mx::astype(o, x.dtype(), s);
  return outs;
}

mx::array dequant_rows(const mx::array& ids, const mx::array& packed, int type, int group, int n, int k) {
  check_packed(packed, type, group, n, k);
  auto s = mx::default_stream(mx::Device::cpu);
  auto id32 = mx::contiguous(mx::astype(ids, mx::int32, s), false, s);
  mx::Shape shape = ids.shape();
  shape.push_back(k);
  return mx::array(shape, mx::float32, std::make_shared<DequantRows>(s, type, group, n, k), {id32, packed});
}

void QMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(x);
  enc.set_input_array(w);
  enc.set_output_array(out);
  const int m = int(x.size() / k_);
  const bool strided = !x.flags().row_contiguous;
  enc.dispatch([xp = x.data<float>(), wp = w.data<uint8_t>(), op = out.data<float>(), m, type = type_,
                group = group_, n = n_, k = k_, strided, shape = x.shape(), strides = x.strides()]() {
    const int tiles = n_tiles(n);
    if (type == F32) {
      const float* xf = float_input(xp, m, k, strided, shape, strides);
      const float* wf = reinterpret_cast<const float*>(wp);
      FloatKernel fk = g_fkernel;
      Pool& p = pool();
      if (std::min(p.threads(), tiles) <= 1 || m * size_t(n) * k < (1u << 16)) {
        fk(wf, n, k, xf, m, op, 0, tiles);
        return;
      }
      p.run([&](int part, int of) {
        const int t0 = int(int64_t(tiles) * part / of), t1 = int(int64_t(tiles) * (part + 1) / of);
        if (t0 < t1) fk(wf, n, k, xf, m, op, t0, t1);
      });
      return;
    }
    const XQuant xq = quantized_input(xp, m, k, strided, shape, strides);
    const Layout l = layout_of(type, group);
    Kernel kern = g_kernel;
    Pool& p = pool();
    const int parts = std::min(p.threads(), tiles);
    if (parts <= 1 || m * size_t(n) * k < (1u << 16)) {
      kern(l, wp, n, k, xq, m, op, 0, tiles);
      return;
    }
    p.run([&](int part, int of) {
      const int t0 = int(int64_t(tiles) * part / of), t1 = int(int64_t(tiles) * (part + 1) / of);
      if (t0 < t1) kern(l, wp, n, k, xq, m, op, t0, t1);
    });
  });
}

void QMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("MlxcelQMatmul runs on the CPU only");
}

bool QMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QMatmul&>(other);
  return type_ == o.type_ && group_ == o.group_ && n_ == o.n_ && k_ == o.k_;
}

std::vector<mx::Shape> QMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = n_;
  return {shape};
}

void QMatmulMulti::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(x);
  const size_t count = outputs.size();
  std::vector<const uint8_t*> wps(count);
  std::vector<float*> ops(count);
  for (size_t i = 0; i < count; ++i) {
    enc.set_input_array(inputs[i + 1]);
    outputs[i].set_data(mx::allocator::malloc(outputs[i].nbytes()));
    enc.set_output_array(outputs[i]);
    wps[i] = inputs[i + 1].data<uint8_t>();
    ops[i] = outputs[i].data<float>();
  }
  const int m = int(x.size() / k_);
  const bool strided = !x.flags().row_contiguous;
  enc.dispatch([xp = x.data<float>(), wps = std::move(wps), ops = std::move(ops), m, types = types_,
                groups = groups_, ns = ns_, k = k_, strided, shape = x.shape(), strides = x.strides()]() {
    const size_t count = ns.size();
    // float32 members read x as it is; x is quantized only when some member is quantized
    const bool any_q = std::any_of(types.begin(), types.end(), [](int t) { return t != F32; });
    const bool any_f = std::any_of(types.begin(), types.end(), [](int t) { return t == F32; });
    const XQuant xq = any_q ? quantized_input(xp, m, k, strided, shape, strides) : XQuant{};
    const float* xf = any_f ? float_input(xp, m, k, strided, shape, strides) : nullptr;
    FloatKernel fk = g_fkernel;
    // The matrices' tiles numbered one after another; each thread takes one contiguous range.
    std::vector<int> first(count + 1, 0);
    size_t work = 0;
    for (size_t i = 0; i < count; ++i) {
      first[i + 1] = first[i] + n_tiles(ns[i]);
      work += size_t(m) * ns[i] * k;
    }
    const int tiles = first[count];
    Kernel kern = g_kernel;
    auto span = [&](int t0, int t1) {
      for (size_t i = 0; i < count; ++i) {
        const int a = std::max(t0, first[i]) - first[i], b = std::min(t1, first[i + 1]) - first[i];
        if (a < b && types[i] == F32) fk(reinterpret_cast<const float*>(wps[i]), ns[i], k, xf, m, ops[i], a, b);
        else if (a < b) kern(layout_of(types[i], groups[i]), wps[i], ns[i], k, xq, m, ops[i], a, b);
      }
    };
    Pool& p = pool();
    const int parts = std::min(p.threads(), tiles);
    if (parts <= 1 || work < (1u << 16)) {
      span(0, tiles);
      return;
    }
    p.run([&](int part, int of) {
      span(int(int64_t(tiles) * part / of), int(int64_t(tiles) * (part + 1) / of));
    });
  });
}

void QMatmulMulti::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("MlxcelQMatmulMulti runs on the CPU only");
}

bool QMatmulMulti::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QMatmulMulti&>(other);
  return types_ == o.types_ && groups_ == o.groups_ && ns_ == o.ns_ && k_ == o.k_;
}

std::vector<mx::Shape> QMatmulMulti::output_shapes(const std::vector<mx::array>& inputs) {
  std::vector<mx::Shape> shapes;
  for (int n : ns_) {
    mx::Shape shape = inputs[0].shape();
    shape.back() = n;
    shapes.push_back(shape);
  }
  return shapes;
}

void DequantRows::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& ids = inputs[0];
  const auto& w = inputs[1];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(ids);
  enc.set_input_array(w);
  enc.set_output_array(out);
  enc.dispatch([ip = ids.data<int32_t>(), count = int(ids.size()), wp = w.data<uint8_t>(), op = out.data<float>(),
                type = type_, group = group_, n = n_, k = k_]() {
    if (type == F32) float_rows(reinterpret_cast<const float*>(wp), n, k, ip, count, op);
    else dequantize_rows(layout_of(type, group), wp, n, k, ip, count, op);
  });
}

void DequantRows::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("MlxcelDequantRows runs on the CPU only");
}

bool DequantRows::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const DequantRows&>(other);
  return type_ == o.type_ && group_ == o.group_ && n_ == o.n_ && k_ == o.k_;
}

std::vector<mx::Shape> DequantRows::output_shapes(const std::vector<mx::array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.push_back(k_);
  return {shape};
}

}  // namespace mlxcel_q
