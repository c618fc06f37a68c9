//! AVX2 loads and stores of a row's first `n` of 8 lanes, shared by the GEMM
//! and direct-convolution microkernels' stores of C.
//!
//! A full row is a plain `vmovups`; only a short one is masked. AMD's masked
//! store (`vmaskmovps`) is microcoded: on a Zen 3 it made storing a 6 x 16
//! tile cost more than 100 cycles, and the GEMM microkernel ran at 84% of
//! the FMA peak instead of 98%.

use std::arch::x86_64::*;

/// Lane mask for the first `n` (clamped to 0..=8) of 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn lanes(n: usize) -> __m256i {
    let n = n.min(8) as i32;
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// The first `n` of 8 values at `p`, zeros in the other lanes.
///
/// # Safety
/// AVX2; `p.add(j)` readable for `j < n.min(8)`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn load(p: *const f32, n: usize) -> __m256 {
    // SAFETY: the caller's; the masked load touches only the first n lanes.
    unsafe {
        if n >= 8 {
            _mm256_loadu_ps(p)
        } else {
            _mm256_maskload_ps(p, lanes(n))
        }
    }
}

/// Stores the first `n` lanes of `v` at `p` (nothing when `n` is 0).
///
/// # Safety
/// AVX2; `p.add(j)` writable for `j < n.min(8)`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn store(p: *mut f32, n: usize, v: __m256) {
    // SAFETY: the caller's; the masked store touches only the first n lanes.
    unsafe {
        if n >= 8 {
            _mm256_storeu_ps(p, v)
        } else if n > 0 {
            _mm256_maskstore_ps(p, lanes(n), v)
        }
    }
}
