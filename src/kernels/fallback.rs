//! Stand-in for the packed GEMM kernel (`kernels::gemm`) and the thread
//! abstraction (`kernels::parallel`) until they land: the same API, naive
//! loops. `kernels/mod.rs` re-exports these modules under the real names.

pub mod parallel {
    /// Runs `f(0..n)`, possibly on several threads.
    pub trait Parallel: Sync {
        fn threads(&self) -> usize;
        fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync));
    }

    /// Everything on the calling thread.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Serial;

    impl Parallel for Serial {
        fn threads(&self) -> usize {
            1
        }
        fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            (0..n).for_each(f)
        }
    }

    /// `std::thread::scope` with up to `.0` threads.
    #[derive(Clone, Copy, Debug)]
    pub struct ScopedThreads(pub usize);

    impl Parallel for ScopedThreads {
        fn threads(&self) -> usize {
            self.0.max(1)
        }
        fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            let t = self.threads().min(n);
            if t <= 1 {
                return (0..n).for_each(f);
            }
            std::thread::scope(|s| {
                for w in 0..t {
                    s.spawn(move || (w..n).step_by(t).for_each(f));
                }
            });
        }
    }
}

pub mod gemm {
    use super::parallel::Parallel;
    use crate::error::{Error, Result};
    use crate::kernels::{math, Isa};
    use crate::plan::Weight;
    use crate::target::Target;

    /// B packed for `target` (here: plain row-major K×N).
    #[derive(Clone, Debug)]
    pub struct PackedB {
        target: Target,
        k: usize,
        n: usize,
        data: Weight,
    }

    impl PackedB {
        pub fn pack(target: Target, b: &[f32], k: usize, n: usize, trans_b: bool) -> PackedB {
            let mut out = vec![0.0; k * n];
            for kk in 0..k {
                for j in 0..n {
                    out[kk * n + j] = if trans_b { b[j * k + kk] } else { b[kk * n + j] };
                }
            }
            PackedB {
                target,
                k,
                n,
                data: Weight::from_vec(out),
            }
        }

        pub fn from_parts(target: Target, k: usize, n: usize, data: Weight) -> Result<PackedB> {
            if data.len() != Self::packed_len(target, k, n) {
                return Err(Error::invalid_graph(format!(
                    "packed B of {k}x{n} needs {} f32, got {}",
                    Self::packed_len(target, k, n),
                    data.len()
                )));
            }
            Ok(PackedB { target, k, n, data })
        }

        pub fn target(&self) -> Target {
            self.target
        }
        pub fn k(&self) -> usize {
            self.k
        }
        pub fn n(&self) -> usize {
            self.n
        }
        pub fn data(&self) -> &Weight {
            &self.data
        }
        pub fn packed_len(_target: Target, k: usize, n: usize) -> usize {
            k * n
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Activation {
        None,
        Relu,
        LeakyRelu(f32),
        Sigmoid,
        Tanh,
        GeluErf,
        GeluTanh,
        Clip(f32, f32),
    }

    impl Activation {
        fn apply(self, x: f32) -> f32 {
            match self {
                Activation::None => x,
                Activation::Relu => {
                    if x < 0.0 {
                        0.0
                    } else {
                        x
                    }
                }
                Activation::LeakyRelu(a) => {
                    if x < 0.0 {
                        a * x
                    } else {
                        x
                    }
                }
                Activation::Sigmoid => math::sigmoid(x),
                Activation::Tanh => math::tanh(x),
                Activation::GeluErf => math::gelu(x),
                Activation::GeluTanh => math::gelu_tanh(x),
                Activation::Clip(lo, hi) => {
                    let y = if x < lo { lo } else { x };
                    if y > hi {
                        hi
                    } else {
                        y
                    }
                }
            }
        }
    }

    /// `c = act(alpha·A·B + bias) + residual`.
    pub struct Epilogue<'a> {
        pub alpha: f32,
        pub bias: Bias<'a>,
        pub activation: Activation,
        pub residual: Option<&'a [f32]>,
    }

    pub enum Bias<'a> {
        None,
        PerColumn(&'a [f32]),
        Full { c: &'a [f32], beta: f32 },
    }

    #[allow(clippy::too_many_arguments)]
    pub fn gemm_packed(
        isa: Isa,
        m: usize,
        a: &[f32],
        lda: usize,
        b: &PackedB,
        c: &mut [f32],
        ldc: usize,
        epi: &Epilogue<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
        gemm(isa, m, b.n, b.k, a, lda, false, &b.data, b.n, false, c, ldc, epi, par)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        _isa: Isa,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        trans_a: bool,
        b: &[f32],
        ldb: usize,
        trans_b: bool,
        c: &mut [f32],
        ldc: usize,
        epi: &Epilogue<'_>,
        _par: &dyn Parallel,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let need_c = (m - 1) * ldc + n;
        if c.len() < need_c {
            return Err(Error::runtime("gemm: C too small"));
        }
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f32;
                for p in 0..k {
                    let av = if trans_a { a[p * lda + i] } else { a[i * lda + p] };
                    let bv = if trans_b { b[j * ldb + p] } else { b[p * ldb + j] };
                    acc += av * bv;
                }
                let mut v = epi.alpha * acc;
                match epi.bias {
                    Bias::None => {}
                    Bias::PerColumn(bias) => v += bias[j],
                    Bias::Full { c, beta } => v += beta * c[i * ldc + j],
                }
                v = epi.activation.apply(v);
                if let Some(r) = epi.residual {
                    v += r[i * ldc + j];
                }
                c[i * ldc + j] = v;
            }
        }
        Ok(())
    }
}
