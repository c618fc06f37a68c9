//! GEMM against an f64 reference.
//!
//! Tolerance: `|got - want| <= 1e-5 * sqrt(k + 1) * scale`, where `scale` is
//! the sum of the magnitudes of everything that went into the value
//! (`|alpha| * sum_k |a b| + |bias| + |residual|`) — the natural bound for a
//! dot product, since cancellation makes an error relative to the result
//! itself meaningless — plus 2e-6 of `|want|` for the activations'
//! approximations (their own accuracy is checked tighter in
//! `activations_match_f64`). Everything with the same target and K blocking
//! must agree bit for bit: threads, packed vs runtime B, storage of `PackedB`.

use std::sync::Arc;

use super::driver::CView;
use super::*;
use super::{epilogue, pack};
use crate::error::ErrorKind;
use crate::kernels::parallel::{ScopedThreads, Serial};
use crate::tensor::AlignedBytes;

/// Every target this machine can run.
fn isas() -> Vec<Isa> {
    let isas: Vec<Isa> = Target::ALL.into_iter().filter_map(Isa::new).collect();
    assert!(isas.iter().any(|i| i.target() == Target::Generic));
    isas
}

/// Deterministic values in [-1, 1).
fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Marks C's padding (between rows) so writes outside the matrix show.
const SENTINEL: f32 = 1234.5;

fn erf64(x: f64) -> f64 {
    if x.abs() < 3.0 {
        // Maclaurin series; terms grow to ~e^9, so ~1e-12 relative accuracy.
        let (mut term, mut sum, x2) = (x, x, x * x);
        for n in 1..200 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        x.signum() * (1.0 - erfc64(x.abs()))
    }
}

/// erfc for x >= 3 by its continued fraction (evaluated backwards).
fn erfc64(x: f64) -> f64 {
    let mut f = 0.0;
    for n in (1..80).rev() {
        f = (n as f64 / 2.0) / (x + f);
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / (x + f)
}

fn gelu_erf64(x: f64) -> f64 {
    if x < -4.0 {
        0.5 * x * erfc64(-x / std::f64::consts::SQRT_2)
    } else {
        0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2))
    }
}

/// `(x·(1 + f))·0.5` overflows in f32 where `2x` does.
fn doubled(x: f64, y: f64) -> f64 {
    if x > f32::MAX as f64 / 2.0 {
        f64::INFINITY
    } else {
        y
    }
}

fn act64(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::LeakyRelu(a) => {
            if x < 0.0 {
                a as f64 * x
            } else {
                x
            }
        }
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::Tanh => x.tanh(),
        Activation::GeluErf => gelu_erf64(x),
        Activation::GeluErfWritten => doubled(x, gelu_erf64(x)),
        Activation::GeluTanhWritten => doubled(x, act64(Activation::GeluTanh, x)),
        // x/2 (1 + tanh u) = x sigmoid(2u), which does not cancel for very negative x.
        Activation::GeluTanh => {
            x / (1.0 + (-2.0 * (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).exp())
        }
        Activation::Clip(lo, hi) => x.max(lo as f64).min(hi as f64),
        Activation::HardSigmoid(a, b) => (a as f64 * x + b as f64).clamp(0.0, 1.0),
        Activation::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
        Activation::Silu => x / (1.0 + (-x).exp()),
    }
}

/// One product's operands in memory, with strides and transposes.
#[derive(Clone)]
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<f32>,
    lda: usize,
    trans_a: bool,
    b: Vec<f32>,
    ldb: usize,
    trans_b: bool,
    ldc: usize,
}

impl Problem {
    /// Random operands; `pad` extra values at the end of each row (stride).
    fn new(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool, pad: usize) -> Problem {
        let (ar, ac) = if trans_a { (k, m) } else { (m, k) };
        let (br, bc) = if trans_b { (n, k) } else { (k, n) };
        let (lda, ldb) = (ac + pad, bc + pad);
        Problem {
            m,
            n,
            k,
            a: data(ar * lda, (m * 31 + n * 7 + k) as u64),
            lda,
            trans_a,
            b: data(br * ldb, (m + n * 13 + k * 5 + 1) as u64),
            ldb,
            trans_b,
            ldc: n + pad,
        }
    }

    fn a_at(&self, i: usize, p: usize) -> f32 {
        if self.trans_a {
            self.a[p * self.lda + i]
        } else {
            self.a[i * self.lda + p]
        }
    }

    fn b_at(&self, p: usize, j: usize) -> f32 {
        if self.trans_b {
            self.b[j * self.ldb + p]
        } else {
            self.b[p * self.ldb + j]
        }
    }

    /// B as a dense row-major (k x n, or n x k if trans_b) matrix, for `PackedB::pack`.
    fn dense_b(&self) -> Vec<f32> {
        let (r, c) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        (0..r).flat_map(|i| self.b[i * self.ldb..][..c].to_vec()).collect()
    }

    fn c_buffer(&self) -> Vec<f32> {
        vec![
            SENTINEL;
            if self.m == 0 {
                0
            } else {
                (self.m - 1) * self.ldc + self.n
            }
        ]
    }

    /// (expected value, error scale) per element of C, row-major m x n.
    fn reference(&self, epi: &Epilogue<'_>) -> Vec<(f64, f64)> {
        let (m, n) = (self.m, self.n);
        let mut out = Vec::with_capacity(m * n);
        for i in 0..m {
            for j in 0..n {
                let (mut dot, mut mag) = (0.0f64, 0.0f64);
                for p in 0..self.k {
                    let t = self.a_at(i, p) as f64 * self.b_at(p, j) as f64;
                    dot += t;
                    mag += t.abs();
                }
                let alpha = epi.alpha as f64;
                let bias = match epi.bias {
                    Bias::None => 0.0,
                    Bias::PerColumn(b) => b[j] as f64,
                    Bias::PerRow(b) => b[i] as f64,
                    Bias::Scalar(s) => s as f64,
                    Bias::Full { beta: 0.0, .. } => 0.0,
                    Bias::Full { c, beta } => beta as f64 * c[i * n + j] as f64,
                };
                let residual = epi.residual.map_or(0.0, |r| r[i * n + j] as f64);
                let want = act64(epi.activation, alpha * dot + bias) + residual;
                out.push((want, alpha.abs() * mag + bias.abs() + residual.abs()));
            }
        }
        out
    }

    fn check(&self, got: &[f32], epi: &Epilogue<'_>, what: &str) {
        let want = self.reference(epi);
        let tol = 1e-5 * ((self.k + 1) as f64).sqrt();
        for i in 0..self.m {
            for j in 0..self.n {
                let g = got[i * self.ldc + j] as f64;
                let (w, scale) = want[i * self.n + j];
                let ok = (g - w).abs() <= tol * scale + 2e-6 * w.abs() + 1e-30 || (g.is_nan() && w.is_nan());
                assert!(ok, "{what}: C[{i}][{j}] = {g}, want {w} (scale {scale})");
            }
            if i + 1 < self.m {
                let pad = &got[i * self.ldc + self.n..(i + 1) * self.ldc];
                assert!(
                    pad.iter().all(|&v| v == SENTINEL),
                    "{what}: row {i}'s padding was written"
                );
            }
        }
    }

    fn run_packed(&self, isa: Isa, epi: &Epilogue<'_>, par: &dyn Parallel) -> Vec<f32> {
        assert!(!self.trans_a);
        let packed = PackedB::pack(isa.target(), &self.dense_b(), self.k, self.n, self.trans_b);
        let mut c = self.c_buffer();
        gemm_packed(isa, self.m, &self.a, self.lda, &packed, &mut c, self.ldc, epi, par).unwrap();
        c
    }

    fn run_runtime(&self, isa: Isa, epi: &Epilogue<'_>, par: &dyn Parallel) -> Vec<f32> {
        let mut c = self.c_buffer();
        let (a, b) = (&self.a, &self.b);
        let (m, n, k) = (self.m, self.n, self.k);
        gemm(
            isa,
            m,
            n,
            k,
            a,
            self.lda,
            self.trans_a,
            b,
            self.ldb,
            self.trans_b,
            &mut c,
            self.ldc,
            epi,
            par,
        )
        .unwrap();
        c
    }
}

// 257 and 800: more than one K block on the generic target (KC 256) and on
// AVX2 / AVX-512 (KC 768); 257 rows are two row blocks where MC is 168.
const SIZES: [usize; 14] = [1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 100, 257, 800];

/// Each size in each dimension (the others moderate), plus M = 1 against each N and K.
fn shapes() -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for s in SIZES {
        out.extend([(s, 33, 17), (17, s, 33), (33, 17, s), (1, s, 65), (1, 65, s)]);
    }
    out
}

#[test]
fn packed_matches_reference_for_odd_sizes() {
    for isa in isas() {
        for trans_b in [false, true] {
            for (m, n, k) in shapes() {
                let p = Problem::new(m, n, k, false, trans_b, (m + n) % 3 * 2);
                let got = p.run_packed(isa, &Epilogue::PLAIN, &Serial);
                p.check(
                    &got,
                    &Epilogue::PLAIN,
                    &format!("{isa:?} packed {m}x{n}x{k} trans_b={trans_b}"),
                );
            }
        }
    }
}

#[test]
fn runtime_matches_reference_for_odd_sizes_and_transposes() {
    for isa in isas() {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            for (m, n, k) in shapes() {
                let p = Problem::new(m, n, k, trans_a, trans_b, (m + k) % 3 * 3);
                let got = p.run_runtime(isa, &Epilogue::PLAIN, &Serial);
                p.check(
                    &got,
                    &Epilogue::PLAIN,
                    &format!("{isa:?} runtime {m}x{n}x{k} ta={trans_a} tb={trans_b}"),
                );
            }
        }
    }
}

#[test]
fn several_cache_blocks_and_b_chunks() {
    // K over several K blocks and several of `gemm`'s B chunks (K chunk: two
    // blocks) for every target (AVX-512's blocks hold up to 768 rows: K = 1700
    // gives 3 blocks of 568, K = 2000 blocks of 668 and a last chunk of one
    // block); N over several B chunks (B_SCRATCH_MAX / K chunk columns); M over MC.
    for isa in isas() {
        for (m, n, k) in [
            (3, 1100, 520),
            (3, 1100, 1700),
            (5, 40, 2000),
            (130, 40, 600),
            (260, 70, 90),
        ] {
            let p = Problem::new(m, n, k, false, false, 1);
            let packed = p.run_packed(isa, &Epilogue::PLAIN, &Serial);
            p.check(&packed, &Epilogue::PLAIN, &format!("{isa:?} packed {m}x{n}x{k}"));
            let runtime = p.run_runtime(isa, &Epilogue::PLAIN, &Serial);
            assert_eq!(packed, runtime, "{isa:?} {m}x{n}x{k}: runtime B differs from packed B");
        }
    }
}

#[test]
fn packed_and_runtime_b_agree_bit_for_bit() {
    for isa in isas() {
        for (m, n, k) in [(2, 33, 17), (17, 65, 300), (40, 100, 7)] {
            for trans_b in [false, true] {
                let p = Problem::new(m, n, k, false, trans_b, 2);
                let epi = Epilogue {
                    alpha: 0.5,
                    activation: Activation::Tanh,
                    ..Epilogue::PLAIN
                };
                assert_eq!(
                    p.run_packed(isa, &epi, &Serial),
                    p.run_runtime(isa, &epi, &Serial),
                    "{isa:?} {m}x{n}x{k}"
                );
            }
        }
    }
}

/// Products read a row-major A in place where the target's kernel can
/// (AVX2), and pack it when told to: the same operations in the same order,
/// so the same bits. Odd M (short tiles), padded rows, narrow and wide
/// products, several K blocks, packed and run-time B.
#[test]
fn a_read_in_place_agrees_with_packed_a_bit_for_bit() {
    let packed_a = |f: &dyn Fn() -> Vec<f32>| {
        super::driver::FORCE_PACKED_A.set(true);
        let c = f();
        super::driver::FORCE_PACKED_A.set(false);
        c
    };
    for isa in isas() {
        for (m, n, k) in [(1, 5, 5), (7, 32, 33), (13, 48, 300), (40, 100, 1700), (200, 17, 64)] {
            let p = Problem::new(m, n, k, false, false, 3);
            let epi = Epilogue {
                alpha: 0.5,
                activation: Activation::Tanh,
                ..Epilogue::PLAIN
            };
            let what = format!("{isa:?} {m}x{n}x{k}");
            let in_place = p.run_packed(isa, &epi, &Serial);
            assert_eq!(
                in_place,
                packed_a(&|| p.run_packed(isa, &epi, &Serial)),
                "{what}, packed B"
            );
            let runtime = p.run_runtime(isa, &epi, &Serial);
            assert_eq!(
                runtime,
                packed_a(&|| p.run_runtime(isa, &epi, &Serial)),
                "{what}, run-time B"
            );
            p.check(&in_place, &epi, &what);
        }
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn a_rows_sharing_l1_sets_are_packed() {
    use super::kernels::{Avx2, Avx512};
    let data = vec![0.0f32; 4096];
    let a = |ld: usize, trans: bool| pack::ASrc { data: &data, ld, trans };
    for (ld, in_place) in [(384, true), (512, true), (1536, true), (1024, false), (3072, false)] {
        assert_eq!(driver::reads_a_in_place::<Avx512>(a(ld, false)), in_place, "ld {ld}");
        assert_eq!(driver::reads_a_in_place::<Avx2>(a(ld, false)), in_place, "ld {ld}");
    }
    assert!(
        !driver::reads_a_in_place::<Avx512>(a(384, true)),
        "transposed A is packed"
    );
}

/// Every epilogue variant (and some combinations) on a multi-tile shape, an M = 1 shape and K = 0.
#[test]
fn epilogues_match_reference() {
    let acts = [
        Activation::None,
        Activation::Relu,
        Activation::LeakyRelu(0.1),
        Activation::Sigmoid,
        Activation::Tanh,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::GeluErfWritten,
        Activation::GeluTanhWritten,
        Activation::Clip(-0.5, 0.75),
        Activation::HardSigmoid(0.2, 0.5),
        Activation::HardSwish,
        Activation::Silu,
    ];
    for isa in isas() {
        for (m, n, k) in [(37, 45, 29), (1, 45, 300), (5, 40, 0), (20, 33, 260)] {
            let col = data(n, 5);
            let row = data(m, 6);
            let full = data(m * n, 7);
            let res = data(m * n, 8);
            let nan = vec![f32::NAN; m * n];
            let biases = [
                Bias::None,
                Bias::PerColumn(&col),
                Bias::PerRow(&row),
                Bias::Scalar(0.25),
                Bias::Full { c: &full, beta: 0.75 },
                Bias::Full { c: &nan, beta: 0.0 },
            ];
            let mut epis = Vec::new();
            for bias in biases {
                for alpha in [1.0, -1.5] {
                    epis.push(Epilogue {
                        alpha,
                        bias,
                        ..Epilogue::PLAIN
                    });
                }
            }
            for act in acts {
                epis.push(Epilogue {
                    activation: act,
                    alpha: 2.0,
                    ..Epilogue::PLAIN
                });
                epis.push(Epilogue {
                    activation: act,
                    bias: Bias::PerColumn(&col),
                    residual: Some(&res),
                    alpha: 0.5,
                });
            }
            epis.push(Epilogue {
                residual: Some(&res),
                ..Epilogue::PLAIN
            });
            epis.push(Epilogue {
                bias: Bias::Full { c: &full, beta: -1.0 },
                activation: Activation::GeluErf,
                residual: Some(&res),
                alpha: 1.0,
            });
            for trans_b in [false, true] {
                let p = Problem::new(m, n, k, trans_b, trans_b, 3);
                for epi in &epis {
                    let what = format!("{isa:?} {m}x{n}x{k} tb={trans_b} {epi:?}");
                    if !trans_b {
                        p.check(&p.run_packed(isa, epi, &Serial), epi, &format!("packed {what}"));
                    }
                    p.check(&p.run_runtime(isa, epi, &Serial), epi, &format!("runtime {what}"));
                }
            }
        }
    }
}

#[test]
fn threads_give_identical_results() {
    // Big enough to be split into several tasks (checked below), odd enough for tails.
    let shapes = [(100, 300, 40), (1, 600, 300), (9, 700, 170), (300, 20, 200)];
    for &(m, n, k) in &shapes {
        for isa in isas() {
            let blk = Blocking::of(isa.target());
            let (rows, cols) = split_work(m, n, k, blk, 2, m == 1);
            assert!(
                rows.count() * cols.count() >= 2,
                "{m}x{n}x{k} {isa:?} is not split: {rows:?} x {cols:?}"
            );
            let res = data(m * n, 9);
            let col = data(n, 10);
            let epi = Epilogue {
                alpha: 0.75,
                bias: Bias::PerColumn(&col),
                activation: Activation::GeluTanh,
                residual: Some(&res),
            };
            for trans_b in [false, true] {
                let p = Problem::new(m, n, k, false, trans_b, 1);
                let serial = p.run_packed(isa, &epi, &Serial);
                p.check(&serial, &epi, &format!("{isa:?} {m}x{n}x{k}"));
                for t in [2, 3] {
                    assert_eq!(
                        serial,
                        p.run_packed(isa, &epi, &ScopedThreads(t)),
                        "packed {isa:?} {m}x{n}x{k} {t} threads"
                    );
                    let runtime = p.run_runtime(isa, &epi, &Serial);
                    assert_eq!(
                        runtime,
                        p.run_runtime(isa, &epi, &ScopedThreads(t)),
                        "runtime {isa:?} {m}x{n}x{k} {t} threads"
                    );
                }
            }
        }
    }
}

#[test]
fn k_blocks_are_equal_and_at_most_kc() {
    for t in [Target::Avx512, Target::Avx2, Target::Generic] {
        let blk = Blocking::of(t);
        for k in [1, 3, 4, 255, 256, 257, 384, 767, 768, 769, 1536, 1700, 5000] {
            let kc = super::k_block(blk, k);
            let blocks = k.div_ceil(kc);
            assert!(kc.is_multiple_of(4) && kc <= blk.kc.max(4), "{t:?} k={k}: block {kc}");
            assert_eq!(blocks, k.div_ceil(blk.kc), "{t:?} k={k}: as few blocks as KC allows");
        }
    }
    assert_eq!(super::k_block(Blocking::of(Target::Avx512), 1536), 768);
    assert_eq!(super::k_block(Blocking::of(Target::Avx512), 384), 384);
}

#[test]
fn row_blocks_fill_the_l2() {
    // Zen 3: 512 KiB of L2 and KC 768 on AVX2: 168 rows of A (504 KiB packed).
    assert_eq!(Blocking::of(Target::Avx2).with_l2(512 << 10).mc, 168);
    // A 1 MiB L2 (Zen 4/5) with AVX-512: 341 rows, in whole 14-row tiles.
    assert_eq!(Blocking::of(Target::Avx512).with_l2(1 << 20).mc, 336);
    // Bounds: at least 4 tiles, at most 448 rows.
    assert_eq!(Blocking::of(Target::Avx2).with_l2(64 << 10).mc, 24);
    assert_eq!(Blocking::of(Target::Avx512).with_l2(32 << 20).mc, 448);
    // A 2 MiB L2 (Sapphire Rapids) with AVX2: 444 rows, whole 6-row tiles.
    assert_eq!(Blocking::of(Target::Avx2).with_l2(2 << 20).mc, 444);
    for t in [Target::Avx512, Target::Avx2, Target::Generic] {
        let host = Blocking::host(t);
        assert_eq!(
            (host.mr, host.nr, host.kc),
            (Blocking::of(t).mr, Blocking::of(t).nr, Blocking::of(t).kc)
        );
        assert!(host.mc.is_multiple_of(host.mr), "{t:?}: {host:?}");
    }
}

#[test]
fn row_tiles_are_few_and_even() {
    let tiles = |len: usize, mr: usize| -> Vec<usize> { pack::row_tiles(10..10 + len, mr).map(|r| r.len()).collect() };
    assert_eq!(tiles(28, 14), [14, 14]);
    assert_eq!(tiles(30, 14), [10, 10, 10]);
    assert_eq!(tiles(32, 14), [11, 11, 10]);
    assert_eq!(tiles(16, 14), [8, 8]);
    assert_eq!(tiles(17, 14), [9, 8]);
    assert_eq!(tiles(3, 14), [3]);
    assert_eq!(tiles(0, 14), Vec::<usize>::new());
    assert_eq!(tiles(7, 6), [4, 3]);
    for len in 0..60 {
        for mr in [6, 8, 14] {
            let r: Vec<_> = pack::row_tiles(5..5 + len, mr).collect();
            assert!(r.windows(2).all(|w| w[0].end == w[1].start) && r.iter().all(|t| (1..=mr).contains(&t.len())));
            assert_eq!(
                (r.first().map_or(5, |t| t.start), r.last().map_or(5, |t| t.end)),
                (5, 5 + len)
            );
            assert_eq!(r.len(), len.div_ceil(mr), "{len} rows, mr {mr}");
            let (lo, hi) = (r.iter().map(|t| t.len()).min(), r.iter().map(|t| t.len()).max());
            assert!(hi.zip(lo).is_none_or(|(h, l)| h - l <= 1), "{len} rows, mr {mr}: {r:?}");
        }
    }
}

#[test]
fn work_is_split_in_whole_tiles() {
    let parts = |len, unit, count| Parts::new(len, unit, count).iter().collect::<Vec<_>>();
    assert_eq!(parts(10, 3, 2), vec![0..6, 6..10]);
    assert_eq!(parts(10, 3, 9), vec![0..3, 3..6, 6..9, 9..10]);
    assert_eq!(parts(0, 3, 2), vec![0..0]);
    assert_eq!(parts(7, 8, 1), vec![0..7]);
    assert_eq!(
        Parts::new(10, 3, 2).shifted(5).iter().collect::<Vec<_>>(),
        vec![5..11, 11..15]
    );
    let blk = Blocking::of(Target::Avx512);
    // Small products stay on one thread.
    let (rows, cols) = split_work(16, 16, 16, blk, 8, false);
    assert_eq!((rows.count(), cols.count()), (1, 1));
    // GEMV splits columns only, into several tasks per thread.
    let (rows, cols) = split_work(1, 1024, 1024, blk, 2, true);
    assert_eq!((rows.count(), cols.count()), (1, 2 * GEMV_TASKS_PER_THREAD));
    assert!(cols.iter().all(|c| c.start % blk.nr == 0));
    // A big square product uses every thread.
    let (rows, cols) = split_work(512, 512, 512, blk, 4, false);
    assert_eq!(rows.count() * cols.count(), 4);
    assert!(rows.iter().all(|r| r.start % blk.mr == 0) && cols.iter().all(|c| c.start % blk.nr == 0));
}

#[test]
fn from_parts_checks_sizes() {
    for t in Target::ALL {
        let nr = Blocking::of(t).nr;
        let (k, n) = (5, nr + 3);
        assert_eq!(PackedB::packed_len(t, k, n), k * 2 * nr);
        let b = data(k * n, 1);
        let packed = PackedB::pack(t, &b, k, n, false);
        assert_eq!(packed.data().len(), PackedB::packed_len(t, k, n));
        assert_eq!((packed.target(), packed.k(), packed.n()), (t, k, n));
        let again = PackedB::from_parts(t, k, n, packed.data().clone()).unwrap();
        assert_eq!(again.data().as_slice(), packed.data().as_slice());
        for (kk, nn) in [(k + 1, n), (k, n + nr), (k - 1, n), (0, n)] {
            let e = PackedB::from_parts(t, kk, nn, packed.data().clone()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidGraph, "{t} {kk}x{nn}");
        }
        // A byte length that is not whole f32 values.
        let odd: Arc<dyn Storage> = Arc::new(AlignedBytes::zeroed(packed.data().byte_len() + 2));
        let w = Weight::in_storage_bytes(odd, 0, packed.data().byte_len() + 2).unwrap();
        assert_eq!(
            PackedB::from_parts(t, k, n, w).unwrap_err().kind,
            ErrorKind::InvalidGraph
        );
        assert_eq!(PackedB::packed_len(t, usize::MAX, 2), usize::MAX);
        let e = PackedB::from_parts(t, usize::MAX, 2, Weight::from_vec(vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph);
        assert_eq!(
            PackedB::try_pack(t, &b, k, n + 1, false).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        assert!(PackedB::pack(t, &[], 0, 0, true).data().is_empty());
    }
}

#[test]
fn packed_b_runs_in_place_from_foreign_storage() {
    for isa in isas() {
        let p = Problem::new(19, 70, 45, false, false, 0);
        let packed = PackedB::pack(isa.target(), &p.b, p.k, p.n, false);
        let want = p.run_packed(isa, &Epilogue::PLAIN, &Serial);
        // As if mapped from a context binary: the packed bytes at some offset of a bigger blob.
        for offset in [64, 4] {
            let mut blob = AlignedBytes::zeroed(offset + packed.data().byte_len() + 64);
            blob.bytes_mut()[..offset].fill(0xAB);
            blob.bytes_mut()[offset..offset + packed.data().byte_len()].copy_from_slice(packed.data().as_bytes());
            let storage: Arc<dyn Storage> = Arc::new(blob);
            let len = PackedB::packed_len(isa.target(), p.k, p.n);
            let w = Weight::in_storage(storage.clone(), offset, len).unwrap();
            let foreign = PackedB::from_parts(isa.target(), p.k, p.n, w).unwrap();
            assert!(foreign.data().shares_storage_with(&storage));
            let mut c = p.c_buffer();
            gemm_packed(
                isa,
                p.m,
                &p.a,
                p.lda,
                &foreign,
                &mut c,
                p.ldc,
                &Epilogue::PLAIN,
                &Serial,
            )
            .unwrap();
            assert_eq!(c, want, "{isa:?} offset {offset}");
        }
    }
}

#[test]
fn inconsistent_sizes_are_errors() {
    let isa = Isa::new(Target::Generic).unwrap();
    let (m, n, k) = (4, 5, 6);
    let a = data(m * k, 1);
    let packed = PackedB::pack(Target::Generic, &data(k * n, 2), k, n, false);
    let mut c = vec![0.0; m * n];
    let plain = Epilogue::PLAIN;
    let runtime = |e: Result<()>| assert_eq!(e.unwrap_err().kind, ErrorKind::Runtime);
    runtime(gemm_packed(isa, m, &a[1..], k, &packed, &mut c, n, &plain, &Serial));
    runtime(gemm_packed(isa, m, &a, k - 1, &packed, &mut c, n, &plain, &Serial));
    runtime(gemm_packed(isa, m, &a, k, &packed, &mut c[1..], n, &plain, &Serial));
    runtime(gemm_packed(isa, m, &a, k, &packed, &mut c, n - 1, &plain, &Serial));
    runtime(gemm_packed(isa, m, &a, usize::MAX, &packed, &mut c, n, &plain, &Serial));
    let short = vec![0.0; 3]; // not m, n or m * n
    let b = data(k * n, 3);
    for epi in [
        Epilogue {
            bias: Bias::PerColumn(&short),
            ..plain
        },
        Epilogue {
            bias: Bias::PerRow(&short),
            ..plain
        },
        Epilogue {
            bias: Bias::Full { c: &short, beta: 1.0 },
            ..plain
        },
        Epilogue {
            residual: Some(&short),
            ..plain
        },
    ] {
        runtime(gemm_packed(isa, m, &a, k, &packed, &mut c, n, &epi, &Serial));
        runtime(gemm(isa, m, n, k, &a, k, false, &b, n, false, &mut c, n, &epi, &Serial));
    }
    if let Some(other) = Isa::new(Target::Avx2) {
        runtime(gemm_packed(other, m, &a, k, &packed, &mut c, n, &plain, &Serial));
    }
    runtime(gemm(
        isa,
        m,
        n,
        k,
        &a,
        k,
        false,
        &b[1..],
        n,
        false,
        &mut c,
        n,
        &plain,
        &Serial,
    ));
    runtime(gemm(
        isa,
        m,
        n,
        k,
        &a,
        k,
        false,
        &b,
        k - 1,
        true,
        &mut c,
        n,
        &plain,
        &Serial,
    ));
    runtime(gemm(
        isa,
        m,
        n,
        k,
        &a,
        m - 1,
        true,
        &b,
        n,
        false,
        &mut c,
        n,
        &plain,
        &Serial,
    ));
    runtime(gemm(
        isa,
        m,
        n,
        k,
        &a[..m * k - 1],
        m,
        true,
        &b,
        n,
        false,
        &mut c,
        n,
        &plain,
        &Serial,
    ));
    // Nothing was written by the failed calls.
    assert!(c.iter().all(|&v| v == 0.0));
}

#[test]
fn empty_products_and_single_rows() {
    for isa in isas() {
        let packed = PackedB::pack(isa.target(), &[], 0, 3, false);
        // m = 0 and n = 0 touch nothing; k = 0 gives the epilogue of zero.
        let mut c = vec![7.0; 3];
        gemm_packed(isa, 0, &[], 0, &packed, &mut c, 3, &Epilogue::PLAIN, &Serial).unwrap();
        gemm(
            isa,
            1,
            0,
            4,
            &[1.0; 4],
            4,
            false,
            &[],
            0,
            false,
            &mut c,
            0,
            &Epilogue::PLAIN,
            &Serial,
        )
        .unwrap();
        assert_eq!(c, [7.0; 3]);
        let bias = [1.0, -2.0, 3.0];
        let epi = Epilogue {
            bias: Bias::PerColumn(&bias),
            activation: Activation::Relu,
            ..Epilogue::PLAIN
        };
        gemm_packed(isa, 1, &[], 0, &packed, &mut c, 3, &epi, &Serial).unwrap();
        assert_eq!(c, [1.0, 0.0, 3.0]);
        // A single row may have any stride; C is exactly n long.
        let p = Problem::new(1, 40, 20, false, false, 0);
        let packed = PackedB::pack(isa.target(), &p.b, 20, 40, false);
        let mut c = vec![0.0; 40];
        gemm_packed(isa, 1, &p.a, 0, &packed, &mut c, 0, &Epilogue::PLAIN, &Serial).unwrap();
        p.check(&c, &Epilogue::PLAIN, "m = 1, lda = ldc = 0");
    }
}

#[test]
fn activations_match_f64() {
    let mut xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 0.005).collect();
    xs.extend((-200..=200).map(|i| i as f32 * 0.5));
    xs.extend([
        1e-30, -1e-30, 1e-8, -1e-8, 0.0, -0.0, 88.0, -87.0, 100.0, -100.0, 1e30, -1e30,
    ]);
    // Relative tolerance as a function of x. The GELUs' far negative tails
    // (|value| < 1e-6 |x| beyond x = -5) lose relative accuracy to the f32
    // rounding of the argument of exp: ~3e-8 x^2 for the erf form (-x^2/2),
    // ~1e-7 x^2 for the tanh form (~-0.07 x^3); their absolute accuracy there
    // is ~1e-12.
    type Case = (&'static str, fn(f32) -> f32, fn(f64) -> f64, fn(f64) -> f64);
    // The `_with::<Fused>` forms are what targets with FMA run (here `mul_add`
    // may be a libm call: slower, same results).
    use epilogue::Fused;
    let cases: [Case; 10] = [
        ("exp fused", epilogue::exp_with::<Fused>, f64::exp, |_| 3e-7),
        (
            "sigmoid fused",
            epilogue::sigmoid_with::<Fused>,
            |x| 1.0 / (1.0 + (-x).exp()),
            |_| 4e-7,
        ),
        ("tanh fused", epilogue::tanh_with::<Fused>, f64::tanh, |_| 4e-7),
        ("gelu_erf fused", epilogue::gelu_erf_with::<Fused>, gelu_erf64, |x| {
            6e-7 + 3e-8 * x * x
        }),
        (
            "gelu_tanh fused",
            epilogue::gelu_tanh_with::<Fused>,
            |x| act64(Activation::GeluTanh, x),
            |x| 6e-7 + 1.5e-7 * x * x,
        ),
        ("exp", epilogue::exp, f64::exp, |_| 3e-7),
        ("sigmoid", epilogue::sigmoid, |x| 1.0 / (1.0 + (-x).exp()), |_| 4e-7),
        ("tanh", epilogue::tanh, f64::tanh, |_| 4e-7),
        ("gelu_erf", epilogue::gelu_erf, gelu_erf64, |x| 6e-7 + 3e-8 * x * x),
        (
            "gelu_tanh",
            epilogue::gelu_tanh,
            |x| act64(Activation::GeluTanh, x),
            |x| 6e-7 + 1.5e-7 * x * x,
        ),
    ];
    for (name, f, want, rel) in cases {
        for &x in &xs {
            let (got, want, rel) = (f(x) as f64, want(x as f64), rel(x as f64));
            if name.starts_with("exp") && !(-87.3..=88.3).contains(&x) {
                continue; // flushed to 0 / inf by design
            }
            let ok = (got - want).abs() <= rel * want.abs() + 1e-37 || (got.is_infinite() && want > 3e38);
            assert!(ok, "{name}({x}) = {got}, want {want}");
        }
        assert!(f(f32::NAN).is_nan(), "{name}(NaN)");
    }
    assert_eq!(epilogue::exp(-200.0), 0.0);
    assert_eq!(epilogue::exp(200.0), f32::INFINITY);
    assert_eq!(epilogue::sigmoid(-200.0), 0.0);
    assert_eq!(epilogue::tanh(f32::INFINITY), 1.0);
    assert_eq!(epilogue::gelu_erf(f32::INFINITY), f32::INFINITY);
    assert_eq!(epilogue::exp_with::<Fused>(-200.0), 0.0);
    assert_eq!(epilogue::exp_with::<Fused>(200.0), f32::INFINITY);
    assert_eq!(epilogue::gelu_erf_with::<Fused>(f32::INFINITY), f32::INFINITY);
    let mut relu = [f32::NAN, -1.0, 2.0];
    epilogue::activate(Activation::Relu, &mut relu);
    assert!(relu[0].is_nan() && relu[1..] == [0.0, 2.0]);
}

#[test]
fn c_views_split_disjointly() {
    for par in [&Serial as &dyn Parallel, &ScopedThreads(3)] {
        c_views_split_disjointly_over(par);
    }
}

fn c_views_split_disjointly_over(par: &dyn Parallel) {
    let mut c = vec![0.0f32; 5 * 7];
    let mut view = CView::new(&mut c, 5, 6, 7).unwrap();
    // Rows [0..4, 4..5], columns [0..4, 4..6]: task t = 2 * row part + column part.
    let tasks = std::sync::atomic::AtomicUsize::new(0);
    view.for_each_part(Parts::new(5, 2, 2), Parts::new(6, 4, 2), par, &|v| {
        let (rows, cols) = (v.rows(), v.cols());
        let t = 2 * (rows.start >= 4) as usize + (cols.start >= 4) as usize;
        let mut tile = v.tile(rows.clone(), cols.clone());
        for r in 0..rows.len() {
            tile.row(r).fill(t as f32 + 1.0);
        }
        tasks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(tasks.into_inner(), 4);
    let want = |i: usize, j: usize| {
        if j == 6 {
            0.0
        } else {
            1.0 + 2.0 * (i >= 4) as u8 as f32 + (j >= 4) as u8 as f32
        }
    };
    for i in 0..5 {
        for j in 0..7 {
            assert_eq!(c[i * 7 + j], want(i, j), "({i}, {j})");
        }
    }
    assert!(CView::new(&mut c, 6, 6, 7).is_err());
}

#[test]
#[should_panic(expected = "bad split")]
fn parts_outside_the_view_panic() {
    let mut c = vec![0.0f32; 16];
    let mut view = CView::new(&mut c, 4, 4, 4).unwrap();
    let _ = view.part(0..5, 0..4);
}

#[test]
fn microkernel_flops_counts_one_full_tile_per_rep() {
    for isa in isas() {
        let blk = Blocking::of(isa.target());
        let flops = microkernel_flops(isa, 16, 3);
        assert_eq!(flops, 2.0 * (blk.mr * blk.nr * 16 * 3) as f64, "{isa:?}");
    }
}

/// B in three packed parts (Q, K and V's weights) gives, bit for bit, the
/// product with the three side by side packed as one, at every M (GEMV
/// included), with the column epilogue, on one and two threads.
#[test]
fn packed_parts_equal_one_packed_b() {
    for isa in isas() {
        let nr = Blocking::of(isa.target()).nr;
        for (m, k, last) in [(1, 70, 3 * nr), (5, 33, nr - 3), (37, 300, 2 * nr)] {
            let widths = [2 * nr, 2 * nr, last];
            let n: usize = widths.iter().sum();
            let a = data(m * k, 1);
            let bs: Vec<Vec<f32>> = widths
                .iter()
                .enumerate()
                .map(|(i, &w)| data(k * w, 2 + i as u64))
                .collect();
            // The three side by side: row r is the parts' rows r one after another.
            let whole: Vec<f32> = (0..k)
                .flat_map(|r| {
                    bs.iter()
                        .zip(widths)
                        .flat_map(move |(b, w)| b[r * w..(r + 1) * w].to_vec())
                })
                .collect();
            let bias = data(n, 9);
            let epi = Epilogue {
                alpha: 0.5,
                bias: Bias::PerColumn(&bias),
                activation: Activation::GeluErf,
                ..Epilogue::PLAIN
            };
            let packed = PackedB::pack(isa.target(), &whole, k, n, false);
            let parts: Vec<PackedB> = bs
                .iter()
                .zip(widths)
                .map(|(b, w)| PackedB::pack(isa.target(), b, k, w, false))
                .collect();
            let parts: Vec<&PackedB> = parts.iter().collect();
            let mut want = vec![0.0; m * n];
            gemm_packed(isa, m, &a, k, &packed, &mut want, n, &epi, &Serial).unwrap();
            for threads in [1, 2] {
                let mut got = vec![f32::NAN; m * n];
                let par = ScopedThreads(threads);
                gemm_packed_parts(isa, m, &a, k, &parts, &mut got, n, &epi, &par).unwrap();
                assert_eq!(got, want, "{isa:?} m {m} k {k} last {last} threads {threads}");
            }
        }
    }
}

/// Parts that cannot be read as one B are refused: another K, an inner part
/// with a partial panel or another width, another target, none or too many.
#[test]
fn packed_parts_that_do_not_fit_are_errors() {
    let isa = Isa::new(Target::Generic).unwrap();
    let nr = Blocking::of(Target::Generic).nr;
    let (m, k) = (3, 5);
    let pack = |k: usize, n: usize| PackedB::pack(Target::Generic, &data(k * n, 4), k, n, false);
    let a = data(m * k, 1);
    let mut c = vec![0.0; m * 8 * nr];
    let (w, short, narrow, deep) = (pack(k, 2 * nr), pack(k, nr + 1), pack(k, nr), pack(k + 1, 2 * nr));
    let plain = Epilogue::PLAIN;
    let mut runtime = |parts: &[&PackedB]| {
        let n: usize = parts.iter().map(|p| p.n()).sum();
        let e = gemm_packed_parts(isa, m, &a, k, parts, &mut c[..m * n], n, &plain, &Serial);
        assert_eq!(
            e.unwrap_err().kind,
            ErrorKind::Runtime,
            "{:?}",
            parts.iter().map(|p| (p.k(), p.n())).collect::<Vec<_>>()
        );
    };
    runtime(&[&w, &deep]);
    runtime(&[&short, &w]);
    runtime(&[&narrow, &w, &w]);
    runtime(&[&w, &w, &w, &w]);
    runtime(&[]);
    if let Some(other) = Target::ALL.into_iter().find(|&t| t != Target::Generic) {
        let foreign = PackedB::pack(other, &data(k * 2 * nr, 4), k, 2 * nr, false);
        runtime(&[&w, &foreign]);
    }
}
