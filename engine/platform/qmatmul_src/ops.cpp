// The primitives' CPU evaluation: activations quantized per row, the ISA's kernel run over
// tiles split among the threads (one contiguous range of output features each), and the
// row dequantizer for embedding lookups.
#include "ops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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
// A call's tiles are cut into grains (about MLXCEL_GRAIN_MACS multiply-adds each, at most 8 per
// thread) that the calling thread and the workers claim one at a time from one word holding the
// call's generation, its grain count and the next grain. The caller never waits for a worker that
// has not come yet: it takes the grains itself, and a late worker finds none left; it waits only
// for grains a worker is computing.
// Which thread computes a grain does not change its bits (a row's operations depend on neither).
//
// On this kind of box (a VM, 2 cores) waking a sleeping thread costs the caller ~11 us and the
// sleeper ~40 us (p90 ms under load), longer than most of a decode step's products (~35 us), so
// workers spin between calls, yielding every MLXCEL_YIELD pauses (the MLX graph-building thread
// and other processes share the cores), and sleep on a futex (std::atomic::wait) only after
// MLXCEL_SPIN_US without a call. A call under MLXCEL_WAKE_MACS does not wake sleeping workers
// (it runs on the caller alone); a larger one (a step's output head) does, and they then spin
// through the next step's small products. Workers run at nice 19 (MLXCEL_KERNEL_WORKERS=nice, the
// default; =idle: SCHED_IDLE; =normal: as the caller), so that they take a core only when the MLX
// threads (the graph build of the next step) and other processes leave it: a busy box then gets
// one thread's speed, not less (the caller takes the grains), an idle core the second share.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::atomic<size_t> g_grain_macs{size_t(std::max(1, env_int("MLXCEL_GRAIN_MACS", 1 << 17)))};
std::atomic<size_t> g_wake_macs{size_t(std::max(0, env_int("MLXCEL_WAKE_MACS", 1 << 20)))};

class Pool {
 public:
  explicit Pool(int threads) : threads_(std::max(1, threads)) {
    spin_us_ = env_int("MLXCEL_SPIN_US", 1000);
    yield_every_ = env_int("MLXCEL_YIELD", 64);
    const char* policy = std::getenv("MLXCEL_KERNEL_WORKERS");
    policy_ = !policy || !std::strcmp(policy, "nice") ? 2 : !std::strcmp(policy, "idle") ? 1 : 0;
    stats_ = env_int("MLXCEL_POOL_STATS", 0) != 0;
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    if (stats_)
      std::fprintf(stderr, "pool: %ld calls split, %ld grains, caller took %ld, waited %.0f us, %ld waits > 50 us\n",
                   st_calls_, st_grains_, st_mine_, st_wait_us_, st_long_);
    if (stats_)
      std::fprintf(stderr, "pool workers: %ld sleeps, %ld jobs seen, %ld grains\n", st_sleeps_.load(), st_wjobs_.load(),
                   st_wgrains_.load());
    stop_.store(true);
    word_.fetch_add(uint64_t(1) << 32);  // a new generation with no grains: wakes the spinners
    wake_.fetch_add(1);
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  // fn(u0, u1) over [0, units) (macs multiply-adds in all) cut into grains; returns when every
  // grain is done.
  void run(int units, size_t macs, const std::function<void(int, int)>& fn) {
    const int grains = int(std::min<size_t>({size_t(units), size_t(threads_) * 8, kMaxGrains,
                                             macs / g_grain_macs.load(std::memory_order_relaxed)}));
    if (threads_ == 1 || grains <= 1 ||
        (macs < g_wake_macs.load(std::memory_order_relaxed) &&
         sleeping_.load(std::memory_order_relaxed) == threads_ - 1)) {
      fn(0, units);
      return;
    }
    // One call at a time owns the pool: the job, grain and done counters are the call's. A second
    // thread calling meanwhile (two MLX streams evaluating at once; a call made from inside a grain)
    // computes its job alone, which changes no bits; sharing the counters would let the two calls
    // clobber each other's grains, and the caller would wait forever for grains nobody computes.
    if (busy_.exchange(true, std::memory_order_acquire)) {
      fn(0, units);
      return;
    }
    struct Release {
      std::atomic<bool>& flag;
      ~Release() { flag.store(false, std::memory_order_release); }
    } release{busy_};
    job_.store(&fn, std::memory_order_relaxed);
    units_.store(units, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = (word_.load(std::memory_order_relaxed) >> 32) + 1;
    word_.store(gen << 32 | uint64_t(grains) << 16, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      wake_.fetch_add(1, std::memory_order_seq_cst);
      wake_.notify_all();
    }
    const int mine = work(gen);
    const auto w0 = stats_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    // What is left is grains a worker claimed and is computing: spin briefly, then yield (on
    // oversubscribed cores a worker may be descheduled mid-grain).
    for (int spins = 0; done_.load(std::memory_order_acquire) != grains; ++spins) {
      if (spins < 4096) MLXCEL_PAUSE();
      else std::this_thread::yield();
    }
    if (stats_) {
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - w0).count();
      st_calls_++, st_grains_ += grains, st_mine_ += mine, st_wait_us_ += us, st_long_ += us > 50;
    }
  }

 private:
  // Claims and computes grains of generation gen until none is left; returns how many it took. The
  // grain count is read from the same word the claim swaps: a count kept beside it (as it once was)
  // could be the next call's, read between that call's store of it and of its generation, and let
  // a late claim through on a finished generation: a grain computed twice, or with the finished
  // call's job (destroyed), and a done count past the next call's grains (the caller then waited
  // forever, or the process crashed; pool_check shows it in seconds).
  int work(uint64_t gen) {
    int claimed = 0;
    uint64_t w = word_.load(std::memory_order_acquire);
    while ((w >> 32) == gen) {
      const int g = int(w & 0xffffu), grains = int((w >> 16) & 0xffffu);
      if (g >= grains) break;
      if (!word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      // Claimed: the call cannot return before this grain is done, so its job is still this one.
      const int units = units_.load(std::memory_order_relaxed);
      (*job_.load(std::memory_order_relaxed))(int(int64_t(units) * g / grains), int(int64_t(units) * (g + 1) / grains));
      done_.fetch_add(1, std::memory_order_release);
      ++claimed;
      w = word_.load(std::memory_order_acquire);
    }
    return claimed;
  }

  void loop() {
#if defined(__linux__)
    if (policy_ == 1) {
      sched_param sp{};
      pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    } else if (policy_ == 2) {
      setpriority(PRIO_PROCESS, pid_t(syscall(SYS_gettid)), 19);
    }
#endif
    uint64_t seen = 0;  // the generation at construction: a job posted before this thread ran is not missed
    while (true) {
      uint64_t gen = word_.load(std::memory_order_acquire) >> 32;
      auto start = std::chrono::steady_clock::now();
      for (int spins = 1; gen == seen; ++spins) {
        MLXCEL_PAUSE();
        if (yield_every_ > 0 && spins % yield_every_ == 0) std::this_thread::yield();
        if (spins % 64 == 0 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(spin_us_)) {
          const uint32_t v = wake_.load(std::memory_order_seq_cst);
          sleeping_.fetch_add(1, std::memory_order_seq_cst);
          if ((word_.load(std::memory_order_seq_cst) >> 32) == seen) wake_.wait(v, std::memory_order_seq_cst);
          if (stats_) st_sleeps_.fetch_add(1, std::memory_order_relaxed);
          sleeping_.fetch_sub(1, std::memory_order_seq_cst);
          start = std::chrono::steady_clock::now();
        }
        gen = word_.load(std::memory_order_acquire) >> 32;
      }
      if (stop_.load()) return;
      seen = gen;
      const int took = work(gen);
      if (stats_) st_wjobs_.fetch_add(1, std::memory_order_relaxed), st_wgrains_.fetch_add(took, std::memory_order_relaxed);
    }
  }

  int threads_;
  int spin_us_, yield_every_, policy_;
  bool stats_;
  std::vector<std::thread> workers_;
  static constexpr size_t kMaxGrains = 0xffff;
  std::atomic<uint64_t> word_{0};  // generation << 32 | the call's grains << 16 | next grain to claim
  std::atomic<int> done_{0}, units_{0};
  std::atomic<const std::function<void(int, int)>*> job_{nullptr};
  std::atomic<int> sleeping_{0};
  std::atomic<uint32_t> wake_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};  // a call owns the pool (run)
  long st_calls_ = 0, st_grains_ = 0, st_mine_ = 0, st_long_ = 0;
  double st_wait_us_ = 0;
  std::atomic<long> st_sleeps_{0}, st_wjobs_{0}, st_wgrains_{0};
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
  if (!std::strcmp(name, "amx")) return has("avx512_vnni") && amx::usable();
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
  if (name == "amx") return amx::matmul;
  if (name == "avx512_vnni") return avx512::matmul;
  if (name == "avx2") return avx2::matmul;
#endif
#if defined(__aarch64__)
  if (name == "neon") return neon::matmul;
#endif
  return scalar::matmul;
}

std::string best_isa() {
  for (const char* name : {"amx", "avx512_vnni", "avx2", "neon"})
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

// The AVX-512 quantizer goes with the AVX-512 kernels (VNNI and AMX), so that comparing the ISAs' results (the
// tests do) compares the quantizers too.
bool vector_quantizer() {
#if defined(__x86_64__) || defined(_M_X64)
  return g_kernel == avx512::matmul || g_kernel == amx::matmul;
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
  auto rows = [&](int r0, int r1) {
    for (int r = r0; r < r1; ++r)
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
  };
  // Rows are independent: a wide call (a prompt chunk, a verify block) splits them among the kernel
  // threads, the same bits whichever thread takes a row.
  split_units(m, size_t(m) * k * 8, rows);
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

}  // namespace

void set_aligned_data(mx::array& out) {
  auto data = mx::allocator::malloc(out.nbytes() + 64);
  const uintptr_t at = reinterpret_cast<uintptr_t>(data.buffer().raw_ptr());
  const int64_t offset = int64_t((64 - at % 64) % 64);
  const auto max_dim = std::max_element(out.shape().begin(), out.shape().end());
  mx::array::Flags flags{true, true, out.size() <= 1 || max_dim == out.shape().end() || out.size() == size_t(*max_dim)};
  out.set_data(std::move(data), out.size(), out.strides(), flags, offset);
}

void check_packed(const mx::array& packed, int type, int group, int n, int k) {
  Layout l = layout_of(type, group);
  if (k % l.group) throw std::invalid_argument("k is not a multiple of the packed type's block");
  if (packed.dtype() != mx::uint8 || packed.nbytes() != packed_bytes(l, n, k))
    throw std::invalid_argument("packed weight has the wrong size for its type and shape");
}


// ----------------------------------------------------------------------------- configuration
std::vector<size_t> set_thread_split(size_t grain_macs, size_t wake_macs) {
  std::vector<size_t> before{g_grain_macs.load(), g_wake_macs.load()};
  g_grain_macs.store(std::max<size_t>(1, grain_macs));
  g_wake_macs.store(wake_macs);
  return before;
}

void set_num_threads(int n) {
  std::lock_guard<std::mutex> g(g_config_mu);
  g_threads = std::max(1, n);
}

int num_threads() { return g_threads; }

void parallel_for(int units, size_t macs, const std::function<void(int, int)>& fn) {
  if (units <= 0) return;
  if (g_threads <= 1 || units == 1) {
    fn(0, units);
    return;
  }
  pool().run(units, macs, fn);
}

long pool_check(int calls, int spin) {
  // Back-to-back calls whose grain counts alternate, each unit counted by the grain that covers
  // it (after `spin` steps of busy work, so that the workers take a share): a unit computed twice,
  // never, or by a grain of another call shows as a bad call.
  long bad = 0;
  const size_t grain = g_grain_macs.load();
  for (int i = 0; i < calls; ++i) {
    const int units = (i % 2) ? 2 + (i / 2) % 3 : 16 + (i / 2) % 17;
    std::vector<int> hits(size_t(units), 0);
    parallel_for(units, size_t(units) * grain, [&hits, units, spin](int u0, int u1) {
      // a grain run for a finished call sees another call's (or a destroyed) vector: stop at once
      if (u0 < 0 || u1 > units || int(hits.size()) != units) std::abort();
      for (int u = u0; u < u1; ++u) {
        volatile int busy = 0;
        for (int j = 0; j < spin; ++j) busy = busy + 1;
        hits[size_t(u)] += 1;
      }
    });
    bad += std::any_of(hits.begin(), hits.end(), [](int h) { return h != 1; });
  }
  return bad;
}

std::string isa() { return g_isa; }

std::string available_isas() {
  std::string out;
  for (const char* name : {"amx", "avx512_vnni", "avx2", "neon", "scalar"})
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
  set_aligned_data(out);
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
      if (std::min(p.threads(), tiles) <= 1) {
        fk(wf, n, k, xf, m, op, 0, tiles);
        return;
      }
      p.run(tiles, m * size_t(n) * k, [&](int t0, int t1) {
        if (t0 < t1) fk(wf, n, k, xf, m, op, t0, t1);
      });
      return;
    }
    XQuant xq = quantized_input(xp, m, k, strided, shape, strides);
    const Layout l = layout_of(type, group);
    Kernel kern = g_kernel;
    Pool& p = pool();
    const int parts = std::min(p.threads(), tiles);
    if (parts <= 1) {
      kern(l, wp, n, k, xq, m, op, 0, tiles);
      return;
    }
    ChunkedRows shared;  // the pieces' one re-laid copy of the rows (layout.h)
    xq.shared = &shared;
    p.run(tiles, m * size_t(n) * k, [&](int t0, int t1) {
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

// x's m rows times each packed W_i into ops[i] (QMatmulMulti's evaluation; ops.h).
void products_into(const float* xp, int m, int k, bool strided, const mx::Shape& shape, const mx::Strides& strides,
                   const std::vector<const uint8_t*>& wps, const std::vector<int>& types,
                   const std::vector<int>& groups, const std::vector<int>& ns, const std::vector<float*>& ops) {
  const size_t count = ns.size();
  // float32 members read x as it is; x is quantized only when some member is quantized
  const bool any_q = std::any_of(types.begin(), types.end(), [](int t) { return t != F32; });
  const bool any_f = std::any_of(types.begin(), types.end(), [](int t) { return t == F32; });
  XQuant xq = any_q ? quantized_input(xp, m, k, strided, shape, strides) : XQuant{};
  ChunkedRows shared;  // the pieces' one re-laid copy of the rows (layout.h), when split
  xq.shared = &shared;
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
  if (parts <= 1) {
    span(0, tiles);
    return;
  }
  p.run(tiles, work, span);
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
    set_aligned_data(outputs[i]);
    enc.set_output_array(outputs[i]);
    wps[i] = inputs[i + 1].data<uint8_t>();
    ops[i] = outputs[i].data<float>();
  }
  const int m = int(x.size() / k_);
  const bool strided = !x.flags().row_contiguous;
  enc.dispatch([xp = x.data<float>(), wps = std::move(wps), ops = std::move(ops), m, types = types_,
                groups = groups_, ns = ns_, k = k_, strided, shape = x.shape(), strides = x.strides()]() {
    products_into(xp, m, k, strided, shape, strides, wps, types, groups, ns, ops);
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
  set_aligned_data(out);
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
