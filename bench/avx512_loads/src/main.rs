//! How much FMA throughput AVX-512 microkernels keep when their operands come
//! from L1, on this CPU: an FMA-only loop (the peak `bench/gemm.rs` uses), then
//! kernels of several tile shapes, and kiln's 14 x 32 with loads removed.
//! A streams through 32 tiles' worth of panels (from L2, as in a GEMM), B is
//! one 64-byte-aligned panel. Also times a chain of dependent `imul`s after
//! each kernel to show the clock did not change.
#![allow(clippy::missing_safety_doc)]

mod kernels;

use std::arch::asm;
use std::arch::x86_64::*;
use std::hint::black_box;
use std::time::Instant;

#[target_feature(enable = "avx512f")]
fn fma_only(iters: u64) -> f32 {
    let mut acc = [_mm512_set1_ps(0.0); 12];
    let (x, y) = (_mm512_set1_ps(black_box(0.999_999)), _mm512_set1_ps(black_box(1e-7)));
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, x, y);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

/// GHz from 8 x 50 000 dependent 3-cycle `imul`s.
fn clock_ghz() -> f64 {
    let t = Instant::now();
    let mut y: u64 = 1;
    for _ in 0..50_000 {
        // SAFETY: register-only arithmetic.
        unsafe {
            asm!("imul {y}, {y}, 3", "imul {y}, {y}, 3", "imul {y}, {y}, 3", "imul {y}, {y}, 3",
                 "imul {y}, {y}, 3", "imul {y}, {y}, 3", "imul {y}, {y}, 3", "imul {y}, {y}, 3",
                 y = inout(reg) y, options(nostack, nomem))
        };
    }
    black_box(y);
    3.0 * 400_000.0 / t.elapsed().as_secs_f64() / 1e9
}

/// GFLOP/s of `f` doing `flops` per call: median of 7 runs of 100 ms.
fn rate(flops: f64, mut f: impl FnMut()) -> f64 {
    let mut runs: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            let mut n = 0u64;
            while t.elapsed().as_millis() < 100 {
                f();
                n += 1;
            }
            flops * n as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[3]
}

fn main() {
    assert!(is_x86_feature_detected!("avx512f"), "needs AVX-512F");
    let kc: usize = std::env::args().nth(1).map_or(256, |s| s.parse().expect("kc"));
    let a = vec![0.5f32; 14 * kc * 32];
    let bbuf = vec![0.25f32; 96 * kc + 16];
    let b = &bbuf[(64 - bbuf.as_ptr() as usize % 64) / 4 % 16..];
    let mut c = vec![0f32; 32 * 16];
    let peak = || {
        // SAFETY: AVX-512F checked above.
        rate(100_000.0 * 12.0 * 32.0, || {
            black_box(unsafe { fma_only(black_box(100_000)) });
        })
    };
    let _ = peak(); // warm up
    let p = peak();
    println!("FMA-only loop: {p:.1} GFLOP/s at {:.2} GHz; kc = {kc}", clock_ghz());
    println!("| kernel | GFLOP/s | % of FMA-only | GHz after |\n|---|---:|---:|---:|");
    for &(name, mr, nv, k) in kernels::KERNELS {
        let tiles = 32 * 14 / mr;
        let flops = 2.0 * (mr * nv * 16 * kc * tiles) as f64;
        let g = rate(flops, || {
            for t in 0..tiles {
                // SAFETY: AVX-512F checked; a holds tiles * mr * kc values, b
                // holds nv * 16 * kc (nv <= 6), c 32 zmm.
                unsafe { k(kc, a.as_ptr().add(t * mr * kc), b.as_ptr(), c.as_mut_ptr()) }
            }
        });
        println!("| {name} | {g:.1} | {:.0}% | {:.2} |", 100.0 * g / p, clock_ghz());
    }
    black_box(&c);
}
