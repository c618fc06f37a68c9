//! Convolution kernel check (issue #13): `cargo bench --bench conv_kernels`.
//!
//! GFLOP/s of `kernels::conv` at ResNet-50 and MobileNet layer shapes
//! (batch 1, channels-last, weights packed beforehand), on this machine's
//! best target, 1 and 2 threads, against the microkernel's in-cache rate
//! (`gemm::microkernel_flops`: the FMA ceiling the GEMM can reach). Each
//! number is the median of several timed runs. The formal comparison with
//! ORT's own convolution is `bench/conv.py`'s. Without `--bench` (as
//! `cargo test --benches` runs it) it only checks that every case runs.
//! `KILN_MAX_TARGET` caps the target as in kiln. Arguments other than `--...` keep only the cases whose names contain
//! one (`cargo bench --bench conv_kernels -- dw`).

use std::hint::black_box;
use std::time::Instant;

use kiln_ep::kernels::conv::{conv, depthwise_weights, pack_groups, Conv, ConvWeights};
use kiln_ep::kernels::gemm::{microkernel_flops, Activation, PackedB};
use kiln_ep::kernels::parallel::{Parallel, ScopedThreads, Serial};
use kiln_ep::kernels::spatial::{output_len, Axis, Window};
use kiln_ep::kernels::Isa;
use kiln_ep::target::Target;

/// (name, size, in channels, out channels, kernel, stride, groups)
const CASES: &[(&str, usize, usize, usize, usize, usize, usize)] = &[
    ("resnet conv1 7x7/2 3->64 @224", 224, 3, 64, 7, 2, 1),
    ("resnet 3x3 64->64 @56", 56, 64, 64, 3, 1, 1),
    ("resnet 3x3 128->128 @28", 28, 128, 128, 3, 1, 1),
    ("resnet 3x3 256->256 @14", 14, 256, 256, 3, 1, 1),
    ("resnet 3x3 512->512 @7", 7, 512, 512, 3, 1, 1),
    ("resnet 1x1 64->256 @56", 56, 64, 256, 1, 1, 1),
    ("resnet 1x1 256->64 @56", 56, 256, 64, 1, 1, 1),
    ("resnet 1x1 1024->256 @14", 14, 1024, 256, 1, 1, 1),
    ("resnet 1x1/2 512->1024 @28", 28, 512, 1024, 1, 2, 1),
    ("mobilenet 1x1 32->64 @112", 112, 32, 64, 1, 1, 1),
    ("mobilenet dw 3x3 128 @56", 56, 128, 128, 3, 1, 128),
    ("squeezenet 1x1 512->1000 @13", 13, 512, 1000, 1, 1, 1),
    ("squeezenet 3x3 32->128 @27", 27, 32, 128, 3, 1, 1),
    ("squeezenet 3x3 16->64 @55", 55, 16, 64, 3, 1, 1),
    ("squeezenet 3x3 64->256 @13", 13, 64, 256, 3, 1, 1),
    ("squeezenet 3x3/2 3->64 @224", 224, 3, 64, 3, 2, 1),
    ("mobilenet dw 3x3/1 32 @112", 112, 32, 32, 3, 1, 32),
    ("mobilenet dw 3x3/2 96 @112", 112, 96, 96, 3, 2, 96),
    ("mobilenet dw 3x3/1 144 @56", 56, 144, 144, 3, 1, 144),
    ("mobilenet dw 3x3/2 144 @56", 56, 144, 144, 3, 2, 144),
    ("mobilenet dw 3x3/1 192 @28", 28, 192, 192, 3, 1, 192),
    ("mobilenet dw 3x3/1 576 @14", 14, 576, 576, 3, 1, 576),
    ("mobilenet dw 3x3/1 960 @7", 7, 960, 960, 3, 1, 960),
    ("mobilenet dw 5x5/1 384 @14", 14, 384, 384, 5, 1, 384),
    ("pp-ocr dw 3x3/1 24 @80", 80, 24, 24, 3, 1, 24),
    ("pp-ocr dw 3x3/1 72 @40", 40, 72, 72, 3, 1, 72),
    ("pp-ocr dw 5x5/2 120 @40", 40, 120, 120, 5, 2, 120),
];

fn axis(input: usize, kernel: usize, stride: usize) -> Axis {
    let pad = kernel / 2;
    Axis {
        input,
        output: output_len(input, kernel, stride, 1, (pad, pad), false).unwrap(),
        kernel,
        stride,
        dilation: 1,
        pad_begin: pad,
        pad_end: pad,
    }
}

/// `len` elements of `buf` from its first 64-byte boundary.
fn aligned(buf: &mut [f32], len: usize) -> &mut [f32] {
    let skip = buf.as_ptr().align_offset(64);
    &mut buf[skip..skip + len]
}

fn median_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[reps / 2]
}

fn main() {
    let timed = std::env::args().any(|a| a == "--bench");
    // --one-thread: skip the 2-thread runs (e.g. two builds timed side by
    // side, one per core, so that both see the same machine).
    let one_thread = std::env::args().any(|a| a == "--one-thread");
    // KILN_MAX_TARGET=x86_64-avx2 measures the AVX2 build on an AVX-512 CPU.
    let target = Target::detect_host().unwrap();
    let isa = Isa::new(target).unwrap();
    // KILN_BENCH_REPS=n: more timed runs per case (e.g. under a profiler).
    let reps = match std::env::var("KILN_BENCH_REPS").ok().and_then(|r| r.parse().ok()) {
        Some(r) if timed => r,
        _ if timed => 15,
        _ => 1,
    };
    let ceiling = {
        let kc = 256;
        // Short runs (a few ms, like the cases), so that a median dodges
        // the time slices other processes take on a shared machine.
        let r = if timed { 2_000 } else { 10 };
        let secs = median_secs(if timed { 41 } else { 1 }, || {
            black_box(microkernel_flops(isa, kc, r));
        });
        microkernel_flops(isa, kc, r) / secs / 1e9
    };
    println!("target {target}: microkernel ceiling {ceiling:.1} GFLOP/s per core\n");
    println!("| layer | GFLOP | 1 thread GFLOP/s | % ceiling | 2 threads GFLOP/s | % 2x ceiling |");
    println!("|---|---|---|---|---|---|");
    // Other arguments (not `--...`) pick the cases whose names contain one.
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    for &(name, size, ci, co, k, stride, groups) in CASES {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let window = Window {
            h: axis(size, k, stride),
            w: axis(size, k, stride),
        };
        // Activations 64-byte aligned, as ORT allocates them.
        let mut x_buf = vec![0.0f32; size * size * ci + 16];
        let x = aligned(&mut x_buf, size * size * ci);
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i % 17) as f32 * 0.01;
        }
        let x = &*x;
        let w: Vec<f32> = (0..co * (ci / groups) * k * k)
            .map(|i| (i % 13) as f32 * 0.01)
            .collect();
        let bias = vec![0.1f32; co];
        let packs: Vec<PackedB> = pack_groups(target, &w, co, ci / groups, k * k, groups).unwrap();
        let refs: Vec<&PackedB> = packs.iter().collect();
        let dw = depthwise_weights(&w, co, k * k);
        let mut y_buf = vec![0.0f32; window.output_pixels() * co + 16];
        let y = aligned(&mut y_buf, window.output_pixels() * co);
        let flops = 2.0 * (window.output_pixels() * co * (ci / groups) * k * k) as f64;
        let mut rates = Vec::new();
        let pars: &[&dyn Parallel] = if one_thread {
            &[&Serial]
        } else {
            &[&Serial, &ScopedThreads(2)]
        };
        for &par in pars {
            let c = Conv {
                window: &window,
                batch: 1,
                in_channels: ci,
                out_channels: co,
                groups,
                x,
                weights: if groups == ci && ci == co {
                    ConvWeights::Depthwise(&dw)
                } else {
                    ConvWeights::Packed(&refs)
                },
                bias: Some(&bias),
                activation: Activation::Relu,
                residual: None,
                after: Activation::None,
            };
            let secs = median_secs(reps, || conv(isa, &c, y, par).unwrap());
            rates.push(flops / secs / 1e9);
        }
        let two = match rates.get(1) {
            Some(r) => format!("{r:.1} | {:.0}%", 50.0 * r / ceiling),
            None => "- | -".into(),
        };
        println!(
            "| {name} | {:.3} | {:.1} | {:.0}% | {two} |",
            flops / 1e9,
            rates[0],
            100.0 * rates[0] / ceiling,
        );
    }
}
