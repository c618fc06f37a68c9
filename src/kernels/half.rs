//! float16 <-> float conversion, bit for bit as ORT's CPU EP casts: what
//! x86's F16C instructions give (round to nearest even; a NaN keeps its sign
//! and the top of its payload and comes out quiet). F16C runs when this CPU
//! has it, whatever the program's target (both paths give the same bits);
//! the scalar functions are the exact fallback and the reference the unit
//! tests hold the SIMD path to.

/// The float a float16 bit pattern stands for (exact: every float16 is a float).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from(h >> 10) & 0x1f;
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        // Subnormal: man · 2^-24, exact in f32.
        (0, _) => sign | (man as f32 * f32::from_bits(0x3380_0000)).to_bits(),
        (0x1f, 0) => sign | 0x7f80_0000,
        // NaN: quieted, payload kept (F16C's vcvtph2ps).
        (0x1f, _) => sign | 0x7fc0_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// The float16 nearest to `x` (ties to even); beyond 65504 rounds to ±inf.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = b & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        // NaN: quieted, the payload's top 10 bits kept (F16C's vcvtps2ph).
        return sign | 0x7e00 | ((a >> 13) & 0x3ff) as u16;
    }
    if a >= 0x477f_f000 {
        // 65520 and up (the midpoint above 65504 rounds to even: inf), and inf.
        return sign | 0x7c00;
    }
    if a >= 0x3880_0000 {
        // A normal float16: rebias the exponent, round the low 13 bits away.
        let r = a - 0x3800_0000;
        return sign | ((r + 0xfff + ((r >> 13) & 1)) >> 13) as u16;
    }
    // A subnormal float16 (or zero): count units of 2^-24.
    let e = a >> 23;
    if e < 102 {
        // Below 2^-25: rounds to zero.
        return sign;
    }
    let m = (a & 0x7f_ffff) | 0x80_0000;
    let shift = 126 - e; // 14..=24
    let q = m >> shift;
    let rem = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = rem > half || (rem == half && q & 1 == 1);
    sign | (q + u32::from(up)) as u16
}

/// `dst[i] = f16_to_f32(src[i])`; F16C when this CPU has it.
pub fn f16_to_f32_slice(src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU has F16C and AVX (checked just above).
        #[allow(unsafe_code)]
        unsafe {
            simd::f16_to_f32(src, dst)
        };
        return;
    }
    f16_to_f32_scalar(src, dst);
}

/// `dst[i] = f32_to_f16(src[i])`; F16C when this CPU has it.
pub fn f32_to_f16_slice(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU has F16C and AVX (checked just above).
        #[allow(unsafe_code)]
        unsafe {
            simd::f32_to_f16(src, dst)
        };
        return;
    }
    f32_to_f16_scalar(src, dst);
}

pub fn f16_to_f32_scalar(src: &[u16], dst: &mut [f32]) {
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(h);
    }
}

pub fn f32_to_f16_scalar(src: &[f32], dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(x);
    }
}

/// Whether this CPU has F16C (and the AVX its 256-bit forms need).
#[cfg(target_arch = "x86_64")]
pub fn has_f16c() -> bool {
    std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
}

#[cfg(not(target_arch = "x86_64"))]
pub fn has_f16c() -> bool {
    false
}

/// The F16C paths, 8 elements at a time; the tail goes through the scalar
/// functions, which give the same bits.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // F16C intrinsics, see each SAFETY comment
pub mod simd {
    use std::arch::x86_64::{
        __m128i, __m256, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_storeu_ps, _mm_loadu_si128,
        _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };

    /// # Safety
    /// The CPU must have F16C and AVX.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` keeps both 8-element accesses in bounds;
            // the loads and stores are unaligned ones.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        super::f16_to_f32_scalar(&src[i..n], &mut dst[i..n]);
    }

    /// # Safety
    /// The CPU must have F16C and AVX.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` keeps both 8-element accesses in bounds;
            // the loads and stores are unaligned ones.
            unsafe {
                let x: __m256 = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
            i += 8;
        }
        super::f32_to_f16_scalar(&src[i..n], &mut dst[i..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_conversions_give_the_known_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        // ORT's CPU EP (F16C) quiets a NaN and keeps its payload.
        assert_eq!(f16_to_f32(0x7c01).to_bits(), 0x7fc0_2000);
        assert_eq!(f16_to_f32(0xfe00).to_bits(), 0xffc0_0000);
        for (x, h) in [
            (0x3f80_1000u32, 0x3c00u16), // 1 + 2^-11: a tie, to even (down)
            (0x3f80_3000, 0x3c02),       // 1 + 3·2^-11: a tie, to even (up)
            (0x3f80_1001, 0x3c01),
            (0x477f_efff, 0x7bff),
            (0x477f_f000, 0x7c00), // 65520: the tie above 65504 goes to inf
            (0x7f7f_ffff, 0x7c00),
            (0x3380_0000, 0x0001), // 2^-24
            (0x3300_0000, 0x0000), // 2^-25: a tie, to even (zero)
            (0x3300_0001, 0x0001),
            (0x387f_e000, 0x0400), // rounds up into the normals
            (0x387f_c000, 0x03ff),
            (0x0000_0001, 0x0000),
            (0x8000_0000, 0x8000),
            (0x7f80_0001, 0x7e00), // a signalling NaN comes out quiet
            (0x7f80_2000, 0x7e01),
            (0xffc1_2345, 0xfe09),
        ] {
            assert_eq!(f32_to_f16(f32::from_bits(x)), h, "{x:#x}");
        }
    }

    #[test]
    fn every_float16_survives_the_round_trip() {
        for h in 0..=u16::MAX {
            let back = f32_to_f16(f16_to_f32(h));
            let nan = h & 0x7c00 == 0x7c00 && h & 0x3ff != 0;
            assert_eq!(back, if nan { h | 0x200 } else { h }, "{h:#x}");
        }
    }

    /// f32 bit patterns around every rounding boundary: each float16, the
    /// midpoints between neighbours, one ulp either side, plus NaN payloads.
    fn edge_f32s() -> Vec<f32> {
        let mut v = Vec::new();
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h).to_bits();
            let mid = x.wrapping_add(0x1000);
            for b in [x, x.wrapping_sub(1), x + 1, mid, mid - 1, mid + 1] {
                v.push(f32::from_bits(b));
            }
        }
        for b in [
            0x7f80_0001,
            0x7fbf_ffff,
            0x7fc0_0000,
            0xffff_ffff,
            0x0000_0001,
            0x807f_ffff,
            0x3300_0000,
        ] {
            v.push(f32::from_bits(b));
        }
        // A pseudo-random sweep over all bit patterns.
        let mut s = 0x9e37_79b9u32;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            v.push(f32::from_bits(s));
        }
        v
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16c_and_scalar_agree_on_every_float16() {
        if !has_f16c() {
            eprintln!("skipped: this CPU has no F16C (the scalar path is all there is)");
            return;
        }
        let src: Vec<u16> = (0..=u16::MAX).collect();
        let (mut simd, mut scalar) = (vec![0f32; src.len()], vec![0f32; src.len()]);
        // SAFETY: has_f16c() checked above.
        #[allow(unsafe_code)]
        unsafe {
            simd::f16_to_f32(&src, &mut simd)
        };
        f16_to_f32_scalar(&src, &mut scalar);
        for (i, (a, b)) in simd.iter().zip(&scalar).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "f16 {i:#x}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16c_and_scalar_agree_on_edge_floats() {
        if !has_f16c() {
            eprintln!("skipped: this CPU has no F16C (the scalar path is all there is)");
            return;
        }
        let src = edge_f32s();
        let (mut simd, mut scalar) = (vec![0u16; src.len()], vec![0u16; src.len()]);
        // SAFETY: has_f16c() checked above.
        #[allow(unsafe_code)]
        unsafe {
            simd::f32_to_f16(&src, &mut simd)
        };
        f32_to_f16_scalar(&src, &mut scalar);
        for ((x, a), b) in src.iter().zip(&simd).zip(&scalar) {
            assert_eq!(a, b, "f32 {:#x}", x.to_bits());
        }
    }

    #[test]
    fn slices_of_any_length_convert_every_element() {
        for n in [0, 1, 7, 8, 9, 17] {
            let src: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut h = vec![0u16; n];
            f32_to_f16_slice(&src, &mut h);
            let mut back = vec![0f32; n];
            f16_to_f32_slice(&h, &mut back);
            assert_eq!(back, src);
        }
    }
}
