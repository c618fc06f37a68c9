//! GEMM benchmark: `cargo bench --bench gemm`.
//!
//! Measures this core's FMA peak (independent zmm / ymm FMAs), then GFLOP/s of
//! `gemm_packed` / `gemm` at square and model shapes per target, single thread
//! and 2 threads for the big ones. Prints a Markdown table and writes it, with
//! the machine, to `bench/results/gemm.md`. Each number is the median of
//! several timed runs. Without `--bench` (as `cargo test --benches` runs it)
//! it only checks that every case runs.
//!
//! Options after `--`: `--quick` (fewer, shorter runs), `--filter TEXT`
//! (cases whose name contains TEXT), `--target avx512|avx2|generic`; the last two
//! do not write the results file.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use kiln_ep::kernels::gemm::{gemm, gemm_packed, microkernel_flops, Activation, Bias, Epilogue, PackedB};
use kiln_ep::kernels::parallel::{Parallel, ScopedThreads, Serial};
use kiln_ep::kernels::Isa;
use kiln_ep::target::Target;

/// One benchmarked product.
struct Case {
    name: &'static str,
    m: usize,
    n: usize,
    k: usize,
    /// Both operands at run time (`gemm`, B transposed if set) instead of `gemm_packed`.
    runtime_b: Option<bool>,
    bias_gelu: bool,
    /// Also run with 2 threads.
    threads2: bool,
    /// Also run the generic target (slow for the big ones).
    generic: bool,
}

const fn case(name: &'static str, m: usize, n: usize, k: usize) -> Case {
    Case {
        name,
        m,
        n,
        k,
        runtime_b: None,
        bias_gelu: false,
        threads2: false,
        generic: true,
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            threads2: true,
            ..case("square 256", 256, 256, 256)
        },
        Case {
            threads2: true,
            ..case("square 512", 512, 512, 512)
        },
        Case {
            threads2: true,
            generic: false,
            ..case("square 1024", 1024, 1024, 1024)
        },
        Case {
            threads2: true,
            ..case("MLP M=1 1024->1024", 1, 1024, 1024)
        },
        Case {
            threads2: true,
            ..case("MLP M=32 1024->1024", 32, 1024, 1024)
        },
        Case {
            threads2: true,
            ..case("BERT M=128 768->768", 128, 768, 768)
        },
        Case {
            threads2: true,
            ..case("BERT M=128 768->3072", 128, 3072, 768)
        },
        Case {
            threads2: true,
            bias_gelu: true,
            ..case("BERT M=128 768->3072 +bias+GELU", 128, 3072, 768)
        },
        Case {
            threads2: true,
            ..case("BERT M=128 3072->768", 128, 768, 3072)
        },
        Case {
            threads2: true,
            generic: false,
            ..case("BERT M=512 768->3072", 512, 3072, 768)
        },
        case("MiniLM M=128 384->1152", 128, 1152, 384),
        case("MiniLM M=128 384->1536", 128, 1536, 384),
        case("MiniLM M=128 1536->384", 128, 384, 1536),
        case("MiniLM M=1024 384->1536", 1024, 1536, 384),
        // One time step of a recurrent layer (H·Rᵀ, LSTM hidden 100, batch 2).
        case("LSTM step M=2 100->400", 2, 400, 100),
        case("encoder M=128 256->256", 128, 256, 256),
        case("encoder M=128 256->1024", 128, 1024, 256),
        case("encoder M=128 1024->256", 128, 256, 1024),
        Case {
            runtime_b: Some(true),
            ..case("attention QKt M=128 N=128 K=64", 128, 128, 64)
        },
        Case {
            runtime_b: Some(false),
            ..case("attention PV M=128 N=64 K=128", 128, 64, 128)
        },
        Case {
            runtime_b: Some(false),
            threads2: true,
            ..case("runtime B 512", 512, 512, 512)
        },
        Case {
            runtime_b: Some(false),
            ..case("runtime B M=1 1024->1024", 1, 1024, 1024)
        },
        Case {
            runtime_b: Some(true),
            ..case("runtime Bt M=1 1024->1024", 1, 1024, 1024)
        },
    ]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let quick = args.iter().any(|a| a == "--quick");
    let filter = args
        .iter()
        .position(|a| a == "--filter")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let only = args
        .iter()
        .position(|a| a == "--target")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let isas: Vec<Isa> = Target::ALL
        .into_iter()
        .filter(|t| only.as_ref().is_none_or(|o| t.name().ends_with(o.as_str())))
        .filter_map(Isa::new)
        .collect();
    if !bench {
        // `cargo test --benches`: run each case once, small, and check nothing fails.
        for c in cases() {
            for &isa in &isas {
                let (m, n, k) = (c.m.min(33), c.n.min(65), c.k.min(17));
                run(isa, &Case { m, n, k, ..c }, &Serial, Duration::ZERO, 1);
            }
        }
        println!("gemm bench: smoke run ok (use `cargo bench --bench gemm` to measure)");
        return;
    }
    let (budget, reps) = if quick {
        (Duration::from_millis(30), 3)
    } else {
        (Duration::from_millis(150), 7)
    };

    // The host sets the clock (it was seen at base clock for a while after idling):
    // warm up, measure the peak before and after the cases, and use the higher.
    let has512 = isas.iter().any(|i| i.target() == Target::Avx512);
    let has256 = isas.iter().any(|i| i.target() >= Target::Avx2);
    if has256 {
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(500) {
            fma_loop(if has512 { Target::Avx512 } else { Target::Avx2 }, 1_000_000);
        }
    }
    let peak512_before = has512.then(|| peak(Target::Avx512));
    if args.iter().any(|a| a == "--peak-only") {
        // For bench/gemm_ort.py: the peak only, one number.
        println!("{:.1}", peak512_before.unwrap_or_else(|| peak(Target::Avx2)));
        return;
    }
    let peak256_before = has256.then(|| peak(Target::Avx2));
    let both512 = has512.then(|| peak_threads(Target::Avx512, 2));

    struct Row {
        name: &'static str,
        m: usize,
        n: usize,
        k: usize,
        target: Target,
        threads: usize,
        gflops: f64,
    }
    let mut rows = Vec::new();
    for c in cases() {
        if filter.as_ref().is_some_and(|f| !c.name.contains(f.as_str())) {
            continue;
        }
        for &isa in &isas {
            if isa.target() == Target::Generic && !c.generic {
                continue;
            }
            let threads: &[usize] = if c.threads2 { &[1, 2] } else { &[1] };
            for &t in threads {
                let gflops = if t == 1 {
                    run(isa, &c, &Serial, budget, reps)
                } else {
                    run(isa, &c, &ScopedThreads(t), budget, reps)
                };
                eprintln!("{} {} {t} thread(s): {gflops:.1} GFLOP/s", c.name, isa.target());
                let (name, m, n, k) = (c.name, c.m, c.n, c.k);
                rows.push(Row {
                    name,
                    m,
                    n,
                    k,
                    target: isa.target(),
                    threads: t,
                    gflops,
                });
            }
        }
    }
    let micro: Vec<(Target, f64)> = isas
        .iter()
        .filter(|i| i.target() != Target::Generic)
        .map(|&isa| (isa.target(), microkernel(isa, budget, reps)))
        .collect();
    let max = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a.max(b));
    let peak512_after = has512.then(|| peak(Target::Avx512));
    let peak512 = max(peak512_before, peak512_after);
    let peak256 = max(peak256_before, has256.then(|| peak(Target::Avx2)));

    let mut out = String::new();
    writeln!(out, "# kiln GEMM benchmark\n").unwrap();
    writeln!(out, "{}\n", machine()).unwrap();
    if let (Some(p), Some(before), Some(after)) = (peak512, peak512_before, peak512_after) {
        writeln!(
            out,
            "Single-core FMA peak, AVX-512 (independent zmm FMAs): **{p:.1} GFLOP/s** \
             (measured before the cases: {before:.1}, after: {after:.1})  "
        )
        .unwrap();
    }
    if let Some(p) = peak256 {
        writeln!(
            out,
            "Single-core FMA peak, AVX2 (independent ymm FMAs): **{p:.1} GFLOP/s**  "
        )
        .unwrap();
    }
    let drift = peak512_before
        .zip(peak512_after)
        .is_some_and(|(b, a)| (b - a).abs() > 0.05 * b.max(a));
    let shared = both512.zip(peak512).is_some_and(|(two, p)| two < 1.8 * p);
    if drift || shared {
        writeln!(
            out,
            "**Warning: something else used the CPU during this run** (peak drifted or both cores \
             together reached < 1.8x one core): the numbers, above all the 2-thread ones, are low.  "
        )
        .unwrap();
    }
    if let (Some(two), Some(p)) = (both512, peak512) {
        writeln!(
            out,
            "Both cores at once, AVX-512: **{two:.1} GFLOP/s** ({:.2}x one core)",
            two / p
        )
        .unwrap();
    }
    for (target, g) in &micro {
        let p = if *target == Target::Avx512 { peak512 } else { peak256 };
        let pct = p.map_or("-".into(), |p| format!("{:.0}%", 100.0 * g / p));
        writeln!(
            out,
            "Microkernel alone, {}: {g:.1} GFLOP/s = **{pct}** of its peak (one full tile over the same \
             L1-resident A and B panels of depth {MICRO_KC}, repeated: the ceiling of every GEMM row below)  ",
            target.name().trim_start_matches("x86_64-")
        )
        .unwrap();
    }
    writeln!(
        out,
        "\nGFLOP/s = 2·M·N·K / time, median of {reps} runs of ≥ {} ms each. \"% peak\": 1 thread against \
         the single-core AVX-512 peak (for avx2 rows, the AVX2 peak in brackets), 2 threads against the \
         both-cores peak. `gemm_packed` unless noted (B pre-packed); \"runtime B\" = `gemm` (B packed on \
         the fly; transposed for QKt and Bt). Threads: `ScopedThreads(2)`, which starts a thread per call.\n",
        budget.as_millis()
    )
    .unwrap();
    writeln!(out, "| case | M | N | K | target | threads | GFLOP/s | % peak |").unwrap();
    writeln!(out, "|---|---:|---:|---:|---|---:|---:|---:|").unwrap();
    for r in &rows {
        let pct = |p: f64| format!("{:.0}%", 100.0 * r.gflops / p);
        let against = if r.threads == 1 { peak512 } else { both512 };
        let pct = match (against, r.target) {
            (Some(p), Target::Avx2) if r.threads == 1 => format!("{} ({})", pct(p), peak256.map_or("-".into(), pct)),
            (Some(p), _) => pct(p),
            (None, _) if r.threads == 1 => peak256.map_or("-".into(), |p| format!("{} of AVX2", pct(p))),
            _ => "-".into(),
        };
        let target = r.target.name().trim_start_matches("x86_64-");
        let (name, m, n, k, t, g) = (r.name, r.m, r.n, r.k, r.threads, r.gflops);
        writeln!(out, "| {name} | {m} | {n} | {k} | {target} | {t} | {g:.1} | {pct} |").unwrap();
    }
    print!("{out}");
    if filter.is_none() && only.is_none() && !quick {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results");
        std::fs::create_dir_all(&dir).expect("create bench/results");
        std::fs::write(dir.join("gemm.md"), &out).expect("write bench/results/gemm.md");
        println!("\nwritten to bench/results/gemm.md");
    }
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

/// GFLOP/s of one case: the median over `reps` runs, each repeating the call for at least `budget`.
fn run(isa: Isa, c: &Case, par: &dyn Parallel, budget: Duration, reps: usize) -> f64 {
    let (m, n, k) = (c.m, c.n, c.k);
    let a = data(m * k, 1);
    let b = data(k * n, 2);
    let bias = data(n, 3);
    let mut out = vec![0.0f32; m * n];
    let packed = PackedB::pack(isa.target(), &b, k, n, false);
    let epi = if c.bias_gelu {
        Epilogue {
            bias: Bias::PerColumn(&bias),
            activation: Activation::GeluErf,
            ..Epilogue::PLAIN
        }
    } else {
        Epilogue::PLAIN
    };
    let mut call = || match c.runtime_b {
        None => gemm_packed(isa, m, &a, k, &packed, &mut out, n, &epi, par).unwrap(),
        Some(trans_b) => {
            let ldb = if trans_b { k } else { n };
            gemm(isa, m, n, k, &a, k, false, &b, ldb, trans_b, &mut out, n, &epi, par).unwrap()
        }
    };
    call();
    let mut per_call = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        let mut calls = 0u32;
        while calls == 0 || start.elapsed() < budget {
            call();
            calls += 1;
        }
        per_call.push(start.elapsed().as_secs_f64() / calls as f64);
    }
    black_box(&out);
    per_call.sort_by(f64::total_cmp);
    2.0 * (m * n * k) as f64 / per_call[reps / 2] / 1e9
}

/// Depth of the microkernel-alone measurement: the AVX-512 and AVX2 `KC`.
const MICRO_KC: usize = 256;

/// GFLOP/s of `isa`'s microkernel alone (see `microkernel_flops`): median of `reps` runs.
fn microkernel(isa: Isa, budget: Duration, reps: usize) -> f64 {
    let mut runs: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            let mut flops = 0.0;
            while flops == 0.0 || start.elapsed() < budget {
                flops += microkernel_flops(isa, MICRO_KC, 1000);
            }
            flops / start.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[reps / 2]
}

/// This core's FMA peak in GFLOP/s for `target` (AVX-512 or AVX2): median of 7 runs.
fn peak(target: Target) -> f64 {
    const ITERS: u64 = 20_000_000;
    let mut runs: Vec<f64> = (0..7)
        .map(|_| {
            let start = Instant::now();
            let lanes = fma_loop(target, ITERS);
            let flops = ITERS as f64 * ACCS as f64 * lanes as f64 * 2.0;
            flops / start.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[3]
}

/// The FMA peak of `threads` cores running `fma_loop` at the same time (sum, GFLOP/s).
fn peak_threads(target: Target, threads: usize) -> f64 {
    const ITERS: u64 = 20_000_000;
    let runs: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            let lanes = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads).map(|_| s.spawn(|| fma_loop(target, ITERS))).collect();
                hs.into_iter().map(|h| h.join().unwrap()).last().unwrap_or(16)
            });
            (threads as u64 * ITERS) as f64 * ACCS as f64 * lanes as f64 * 2.0 / start.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    let mut runs = runs;
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

/// Independent accumulators per iteration: enough to cover FMA latency x
/// throughput (8), few enough to stay in registers (16 already spills).
const ACCS: usize = 12;

/// Runs `iters` x `ACCS` independent FMAs; returns the vector width in f32 lanes.
#[cfg(target_arch = "x86_64")]
fn fma_loop(target: Target, iters: u64) -> usize {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,fma")]
    fn zmm(iters: u64) -> f32 {
        let mut acc = [_mm512_set1_ps(0.0); ACCS];
        let x = _mm512_set1_ps(black_box(0.999_999));
        let y = _mm512_set1_ps(black_box(1e-7));
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, x, y);
            }
        }
        acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
    }

    #[target_feature(enable = "avx2,fma")]
    fn ymm(iters: u64) -> f32 {
        let mut acc = [_mm256_set1_ps(0.0); ACCS];
        let x = _mm256_set1_ps(black_box(0.999_999));
        let y = _mm256_set1_ps(black_box(1e-7));
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, x, y);
            }
        }
        let mut out = [0.0f32; 8];
        let sum = acc.iter().fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a));
        // SAFETY: out holds 8 f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
        out.iter().sum()
    }

    match target {
        Target::Avx512 => {
            // SAFETY: only called when Isa::new(Avx512) succeeded (AVX-512F + FMA).
            black_box(unsafe { zmm(iters) });
            16
        }
        _ => {
            // SAFETY: only called when the CPU has AVX2 + FMA.
            black_box(unsafe { ymm(iters) });
            8
        }
    }
}

/// Model name, core count, caches and the FMA-relevant flags of this machine.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let flags = field("flags");
    let has: Vec<&str> = [
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512dq",
        "avx512_fp16",
    ]
    .into_iter()
    .filter(|f| flags.split(' ').any(|x| x == *f))
    .collect();
    let cache = |idx: usize| {
        let p = format!("/sys/devices/system/cpu/cpu0/cache/index{idx}");
        let r = |f: &str| {
            std::fs::read_to_string(format!("{p}/{f}"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        format!(
            "L{}{} {}",
            r("level"),
            if r("type") == "Data" { "d" } else { "" },
            r("size")
        )
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "Machine: {} ({} logical CPUs, {} MHz reported), {} and {} per core, {} shared; flags: {}. \
         Built with `cargo bench` (release, opt-level 3, no target-cpu: kernels use `#[target_feature]`).",
        field("model name"),
        cpus,
        field("cpu MHz"),
        cache(0),
        cache(2),
        cache(3),
        has.join(" "),
    )
}
