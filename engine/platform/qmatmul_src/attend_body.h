// The attention's arithmetic (fused.cpp), included once per instruction set inside its own
// namespace, after that namespace defines fma8(a, b, c): a * b + c per lane with one rounding.
// Every inclusion computes the same operations in the same order, so the same bits.

// The weighted sum over keys j0 .. j1-1 of NV vectors (features d0 .. d0 + 8 NV) added to o, which
// holds the sum over keys 0 .. j0-1 (nothing read when j0 is 0): the sum in key order, one fused
// multiply-add a key, the accumulators passing through memory between blocks as float32 (no rounding).
template <int NV>
MLXCEL_INLINE void weighted_block(const float* e, int j0, int j1, const View4& vv, int b, int hk, int d0,
                                         float* o) {
  vf8 acc[NV];
  for (int t = 0; t < NV; ++t) acc[t] = j0 == 0 ? vf8{} : load8(o + d0 + 8 * t);
  for (int j = j0; j < j1; ++j) {
    const float* vr = vv.row(b, hk, j) + d0;
    const vf8 ej = vf8{} + e[j];
#pragma GCC unroll 8
    for (int t = 0; t < NV; ++t) acc[t] = fma8(ej, load8(vr + 8 * t), acc[t]);
  }
  for (int t = 0; t < NV; ++t) store8(o + d0 + 8 * t, acc[t]);
}

// The weighted sums of one query over keys j0 .. j1-1, every feature (D a multiple of 8) into o.
MLXCEL_INLINE void weighted_range(const float* e, int j0, int j1, const View4& vv, int b, int hk, int D, float* o) {
  int d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) weighted_block<8>(e, j0, j1, vv, b, hk, d0, o);
  switch ((D - d0) / 8) {
    case 7: weighted_block<7>(e, j0, j1, vv, b, hk, d0, o); break;
    case 6: weighted_block<6>(e, j0, j1, vv, b, hk, d0, o); break;
    case 5: weighted_block<5>(e, j0, j1, vv, b, hk, d0, o); break;
    case 4: weighted_block<4>(e, j0, j1, vv, b, hk, d0, o); break;
    case 3: weighted_block<3>(e, j0, j1, vv, b, hk, d0, o); break;
    case 2: weighted_block<2>(e, j0, j1, vv, b, hk, d0, o); break;
    case 1: weighted_block<1>(e, j0, j1, vv, b, hk, d0, o); break;
    default: break;
  }
}

// One query's scores for the 8 keys kr into s[0 .. 8).
MLXCEL_INLINE void score8(const float* qs, const float* const* kr, int D, float* s) {
  vf8 a0{}, a1{}, a2{}, a3{}, a4{}, a5{}, a6{}, a7{};
  for (int c = 0; c < D; c += 8) {
    const vf8 qv = load8(qs + c);
    a0 = fma8(qv, load8(kr[0] + c), a0);
    a1 = fma8(qv, load8(kr[1] + c), a1);
    a2 = fma8(qv, load8(kr[2] + c), a2);
    a3 = fma8(qv, load8(kr[3] + c), a3);
    a4 = fma8(qv, load8(kr[4] + c), a4);
    a5 = fma8(qv, load8(kr[5] + c), a5);
    a6 = fma8(qv, load8(kr[6] + c), a6);
    a7 = fma8(qv, load8(kr[7] + c), a7);
  }
  store8(s, reduce8(a0, a1, a2, a3, a4, a5, a6, a7));
}

// Scores s[0 .. n) (s[n .. n rounded up to 8) holding copies of score n-1) into the weights
// e_j = exp_poly(s_j - max) in place, zeros after n; returns 1 / (their 8-lane tree sum).
MLXCEL_INLINE float softmax8(float* s, int n) {
  const int n8 = (n + 7) & ~7;
  vf8 m = load8(s);
  for (int j = 8; j < n8; j += 8) {
    const vf8 x = load8(s + j);
    m = m > x ? m : x;
  }
  float mx_ = m[0];
  for (int t = 1; t < 8; ++t) mx_ = std::max(mx_, m[t]);
  for (int j = 0; j < n; ++j) s[j] = exp_poly(s[j] - mx_);
  for (int j = n; j < n8; ++j) s[j] = 0.f;
  vf8 sum{};
  for (int j = 0; j < n8; j += 8) sum += load8(s + j);
  return 1.f / tree8(sum);
}

// One query against keys 0 .. n-1 (n >= 1) of head (b, hk) into o[D]. qs: the query times the
// scale, D8 = D rounded up to 8 floats, zero-padded; sc: room for n + 8 floats; kpad: room for 8
// padded key rows (8 * D8 floats), used when a key row is strided or D is not a multiple of 8.
void attend(const float* qs, const View4& kv, const View4& vv, int b, int hk, int n, int D,
                          float* sc, float* kpad, float* o) {
  const int D8 = (D + 7) & ~7;
  const bool krows = kv.s3 == 1 && D == D8;
  for (int j0 = 0; j0 < n; j0 += 8) {
    const float* kr[8];
    for (int t = 0; t < 8; ++t) {
      kr[t] = kv.row(b, hk, std::min(j0 + t, n - 1));
      if (!krows) {
        float* r = kpad + t * D8;
        for (int d = 0; d < D; ++d) r[d] = kr[t][d * kv.s3];
        for (int d = D; d < D8; ++d) r[d] = 0.f;
        kr[t] = r;
      }
    }
    score8(qs, kr, D8, sc + j0);
  }
  const float inv = softmax8(sc, n);  // sc[n .. n8) repeat score n-1: the max is unchanged
  if (vv.s3 == 1) {
    weighted_range(sc, 0, n, vv, b, hk, D & ~7, o);
    for (int d = 0; d < (D & ~7); d += 8) store8(o + d, load8(o + d) * inv);
  }
  // features a vector does not cover (all of them for a strided v): the same sums one lane at a time
  for (int d = vv.s3 == 1 ? (D & ~7) : 0; d < D; ++d) {
    float acc = 0.f;
    for (int j = 0; j < n; ++j) acc = std::fma(sc[j], vv.row(b, hk, j)[d * vv.s3], acc);
    o[d] = acc * inv;
  }
}

// Queries q[0 .. nq) against head (b, hk), each computed with exactly `attend`'s operations in
// `attend`'s order (so the same bits), but with the keys and values read from memory once for the
// group rather than once per query: every query scores a group of 8 keys while those rows sit in
// L1, then the next group; the weighted sums advance block by block of kValueBlock keys, each
// query's accumulators kept in its output between blocks. A query's last group holds keys it does
// not see (other queries do); its scores there are replaced by the score of its last key, as
// `attend` computes them. Where the inclusion defines MLXCEL_ATTEND_PAIRS, two neighbouring queries
// go through score_pair / weighted_range_pair together (their lanes side by side in one register,
// each lane's operations unchanged). For unit-stride key and value rows and D a multiple of 8 (the
// callers check); sc: nq rows of ld >= (max n rounded up to 8) floats; inv: nq floats.
void attend_many(const QueryRef* q, int nq, const View4& kv, const View4& vv, int b, int hk, int D, float* sc,
                 int ld, float* inv) {
  int nmax = 0;
  for (int i = 0; i < nq; ++i) nmax = std::max(nmax, q[i].n);
  for (int j0 = 0; j0 < nmax; j0 += 8) {
    const float* kr[8];
    for (int t = 0; t < 8; ++t) kr[t] = kv.row(b, hk, std::min(j0 + t, nmax - 1));
    for (int i = 0; i < nq; ++i) {
      if (q[i].n <= j0) continue;
#ifdef MLXCEL_ATTEND_PAIRS
      if (i + 1 < nq && q[i + 1].n > j0) {
        score_pair(q[i].qs, q[i + 1].qs, kr, D, sc + size_t(i) * ld + j0, sc + size_t(i + 1) * ld + j0);
        ++i;
        continue;
      }
#endif
      score8(q[i].qs, kr, D, sc + size_t(i) * ld + j0);
    }
  }
  for (int i = 0; i < nq; ++i) {  // attend's softmax, query by query
    float* s = sc + size_t(i) * ld;
    const int n = q[i].n;
    for (int j = n; j < ((n + 7) & ~7); ++j) s[j] = s[n - 1];
    inv[i] = softmax8(s, n);
  }
  for (int j0 = 0; j0 < nmax; j0 += kValueBlock) {
    for (int i = 0; i < nq; ++i) {
      if (q[i].n <= j0) continue;
      const float* e = sc + size_t(i) * ld;
      const int j1 = std::min(j0 + kValueBlock, q[i].n);
#ifdef MLXCEL_ATTEND_PAIRS
      if (i + 1 < nq && q[i + 1].n > j0) {  // the keys both see together, then each one's own
        const float* e2 = sc + size_t(i + 1) * ld;
        const int j2 = std::min(j0 + kValueBlock, q[i + 1].n), jc = std::min(j1, j2);
        weighted_range_pair(e, e2, j0, jc, vv, b, hk, D, q[i].o, q[i + 1].o);
        if (j1 > jc) weighted_range(e, jc, j1, vv, b, hk, D, q[i].o);
        if (j2 > jc) weighted_range(e2, jc, j2, vv, b, hk, D, q[i + 1].o);
        ++i;
        continue;
      }
#endif
      weighted_range(e, j0, j1, vv, b, hk, D, q[i].o);
    }
  }
  for (int i = 0; i < nq; ++i) {
    float* o = q[i].o;
    for (int d = 0; d < D; d += 8) store8(o + d, load8(o + d) * inv[i]);
  }
}
