//! `exp` of f32 values with the bits of the C library's `expf` (glibc 2.27
//! and later, which took it from Arm's optimized-routines): the argument is
//! reduced in double precision against a 32-entry table of `2^(i/32)`, a
//! cubic polynomial approximates the rest, and the double result is rounded
//! once to f32. Written out here so that SwiGLU's sigmoid (which has always
//! used the C library's `expf`, to give the bits of burn's own `silu`) no
//! longer depends on which C library or CPU variant of it runs, and so that
//! it runs eight values per instruction where the CPU has AVX-512 (four
//! with AVX2, two per register with NEON on 64-bit ARM) instead of one call
//! per value.
//!
//! The multiply-adds are fused, as in the C library's FMA variant
//! (`__expf_fma`, the one glibc picks on every CPU with FMA): on two of the
//! four billion inputs the unfused variant differs in the last bit. The
//! scalar code (`f64::mul_add`) and the AVX2, AVX-512 and NEON code
//! (`vfmadd`, `fmla`) do the same operations, so they give the same bits. `just check-expf` compares every
//! f32 input with the C library's; the unit tests check a sample and pin a
//! few values, so the port is checked even where another C library runs.
//! Measured in `just bench-kernels` (`exp`).

use std::mem::MaybeUninit;

use crate::written::write_all;

/// `2^(i/32)` rounded to double, less `i << 47` (so that adding `k << 47`
/// for `k = 32 e + i` scales it by `2^e`).
const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `32 / ln 2` (`0x1.71547652b82fep+0 * 32`).
const INV_LN2_32: f64 = f64::from_bits(0x3ff7_1547_652b_82fe) * 32.0;
/// `1.5 * 2^52`: adding it rounds a double to an integer in its low bits.
const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// The polynomial `C0 r^3 + C1 r^2 + C2 r + 1 ~ 2^(r/32)`: the coefficients
/// of `2^r` (`0x1.c6af84b912394p-5`, `0x1.ebfce50fac4f3p-3`,
/// `0x1.62e42ff0c52d6p-1`) divided by the powers of 32 (exactly).
const C0: f64 = f64::from_bits(0x3fac_6af8_4b91_2394) / 32_768.0;
const C1: f64 = f64::from_bits(0x3fce_bfce_50fa_c4f3) / 1_024.0;
const C2: f64 = f64::from_bits(0x3fe6_2e42_ff0c_52d6) / 32.0;
/// Above this (`0x1.62e42ep6`) `expf` overflows to `+inf`.
const OVERFLOW: f32 = f32::from_bits(0x42b1_7217);
/// Below this (`-0x1.9fe368p6`) `expf` underflows to `+0`.
const UNDERFLOW: f32 = f32::from_bits(0xc2cf_f1b4);

/// `e^x`, with the bits of glibc's `expf`.
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x + x;
    }
    if x > OVERFLOW {
        return f32::INFINITY;
    }
    if x < UNDERFLOW {
        return 0.0;
    }
    let xd = f64::from(x);
    let rounded = INV_LN2_32.mul_add(xd, SHIFT);
    let k = rounded.to_bits();
    let r = INV_LN2_32.mul_add(xd, -(rounded - SHIFT));
    let scale = f64::from_bits(TABLE[(k % 32) as usize].wrapping_add(k << 47));
    let p = C0.mul_add(r, C1);
    let y = C2.mul_add(r, 1.0);
    (p.mul_add(r * r, y) * scale) as f32
}

/// The logistic function `1 / (1 + e^-x)` as burn's CPU backend computes
/// it, one branch per sign: `1 / (1 + e^-x)` for `x >= 0`, `e^x / (1 + e^x)`
/// below.
pub fn sigmoid(x: f32) -> f32 {
    let e = exp(-x.abs());
    if x >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

/// `out[i] = sigmoid(x[i])`, the same bits as [`sigmoid`], vectorised;
/// `out` (uninitialised or not) is returned written.
///
/// # Panics
/// If the slices differ in length.
#[inline(always)]
pub fn sigmoid_into<'a>(x: &[f32], out: &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] {
    assert_eq!(x.len(), out.len(), "sigmoid_into: lengths differ");
    let out = write_all(out, x.iter().map(|v| -v.abs()));
    exp_in_place(out);
    for (o, &v) in out.iter_mut().zip(x) {
        let e = *o;
        *o = if v >= 0.0 {
            1.0 / (1.0 + e)
        } else {
            e / (1.0 + e)
        };
    }
    out
}

/// `x[i] = exp(x[i])`, the same bits as [`exp`]: eight values at a time
/// with AVX-512, four with AVX2, one at a time without either.
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked just above).
        unsafe { avx512::exp_in_place(x) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA are present (checked just above).
        unsafe { avx2::exp_in_place(x) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    {
        neon::exp_in_place(x);
    }
    #[cfg(not(target_arch = "aarch64"))]
    for v in x {
        *v = exp(*v);
    }
}

/// `x[i] = libm::expf(x[i])` (the `libm` crate's software `expf`, FreeBSD's
/// algorithm in f32: what the softmax kernels use), the same bits, sixteen
/// values at a time with AVX-512 or eight with AVX2 where the argument is
/// in the common range (`-inf` included), one `libm::expf` call per value
/// elsewhere.
pub fn libm_exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked just above).
        unsafe { avx512_libm::libm_exp_in_place(x) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked just above).
        unsafe { avx2_libm::libm_exp_in_place(x) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    {
        neon_libm::libm_exp_in_place(x);
    }
    #[cfg(not(target_arch = "aarch64"))]
    for v in x {
        *v = libm::expf(*v);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{exp, C0, C1, C2, INV_LN2_32, OVERFLOW, SHIFT, TABLE, UNDERFLOW};

    /// Four f32 values (in an SSE register) through [`exp`]'s steps in
    /// double precision; lanes outside `[UNDERFLOW, OVERFLOW]` (or NaN)
    /// are left for the caller to redo.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp4(x: __m128) -> __m128 {
        let xd = _mm256_cvtps_pd(x);
        let inv_ln2 = _mm256_set1_pd(INV_LN2_32);
        let rounded = _mm256_fmadd_pd(inv_ln2, xd, _mm256_set1_pd(SHIFT));
        let k = _mm256_castpd_si256(rounded);
        let kd = _mm256_sub_pd(rounded, _mm256_set1_pd(SHIFT));
        let r = _mm256_fmsub_pd(inv_ln2, xd, kd);
        let index = _mm256_and_si256(k, _mm256_set1_epi64x(31));
        let entry = _mm256_i64gather_epi64::<8>(TABLE.as_ptr().cast::<i64>(), index);
        let scale = _mm256_castsi256_pd(_mm256_add_epi64(entry, _mm256_slli_epi64::<47>(k)));
        let p = _mm256_fmadd_pd(_mm256_set1_pd(C0), r, _mm256_set1_pd(C1));
        let y = _mm256_fmadd_pd(_mm256_set1_pd(C2), r, _mm256_set1_pd(1.0));
        let y = _mm256_fmadd_pd(p, _mm256_mul_pd(r, r), y);
        _mm256_cvtpd_ps(_mm256_mul_pd(y, scale))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_in_place(x: &mut [f32]) {
        let (low, high) = (_mm_set1_ps(UNDERFLOW), _mm_set1_ps(OVERFLOW));
        let mut chunks = x.chunks_exact_mut(4);
        for chunk in &mut chunks {
            let v = _mm_loadu_ps(chunk.as_ptr());
            let out = exp4(v);
            // Ordered comparisons: NaN lanes count as out of range.
            let inside = _mm_and_ps(_mm_cmpge_ps(v, low), _mm_cmple_ps(v, high));
            _mm_storeu_ps(chunk.as_mut_ptr(), out);
            if _mm_movemask_ps(inside) != 0b1111 {
                // Some lane needs the special cases: redo all four.
                let input: [f32; 4] = std::mem::transmute(v);
                for (value, input) in chunk.iter_mut().zip(input) {
                    *value = exp(input);
                }
            }
        }
        for v in chunks.into_remainder() {
            *v = exp(*v);
        }
    }
}

/// [`avx2`]'s steps on 64-bit ARM: four values as two NEON registers of
/// two doubles, the multiply-adds fused (`fmla`), the table read one lane
/// at a time (NEON has no gather). Each lane does the same operations, so
/// the bits are the same.
#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use super::{exp, C0, C1, C2, INV_LN2_32, OVERFLOW, SHIFT, TABLE, UNDERFLOW};

    /// Two values in double precision through [`exp`]'s steps; lanes
    /// outside `[UNDERFLOW, OVERFLOW]` (or NaN) are left for the caller.
    #[inline]
    fn exp2(xd: float64x2_t) -> float64x2_t {
        // SAFETY: NEON is part of aarch64's base instruction set; these
        // intrinsics only compute on registers.
        unsafe {
            let (inv_ln2, shift) = (vdupq_n_f64(INV_LN2_32), vdupq_n_f64(SHIFT));
            let rounded = vfmaq_f64(shift, inv_ln2, xd);
            let k = vreinterpretq_u64_f64(rounded);
            let r = vfmaq_f64(vnegq_f64(vsubq_f64(rounded, shift)), inv_ln2, xd);
            let index = vandq_u64(k, vdupq_n_u64(31));
            let entries = [
                TABLE[vgetq_lane_u64::<0>(index) as usize],
                TABLE[vgetq_lane_u64::<1>(index) as usize],
            ];
            let scale =
                vreinterpretq_f64_u64(vaddq_u64(vld1q_u64(entries.as_ptr()), vshlq_n_u64::<47>(k)));
            let p = vfmaq_f64(vdupq_n_f64(C1), vdupq_n_f64(C0), r);
            let y = vfmaq_f64(vdupq_n_f64(1.0), vdupq_n_f64(C2), r);
            let y = vfmaq_f64(y, p, vmulq_f64(r, r));
            vmulq_f64(y, scale)
        }
    }

    pub(super) fn exp_in_place(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(4);
        for chunk in &mut chunks {
            // SAFETY: `chunk` holds four values; NEON is always present.
            unsafe {
                let v = vld1q_f32(chunk.as_ptr());
                let low = exp2(vcvt_f64_f32(vget_low_f32(v)));
                let high = exp2(vcvt_high_f64_f32(v));
                vst1q_f32(
                    chunk.as_mut_ptr(),
                    vcvt_high_f32_f64(vcvt_f32_f64(low), high),
                );
                // Ordered comparisons: NaN lanes count as out of range.
                let inside = vandq_u32(
                    vcgeq_f32(v, vdupq_n_f32(UNDERFLOW)),
                    vcleq_f32(v, vdupq_n_f32(OVERFLOW)),
                );
                if vminvq_u32(inside) != u32::MAX {
                    // Some lane needs the special cases: redo all four.
                    let input: [f32; 4] = std::mem::transmute(v);
                    for (value, input) in chunk.iter_mut().zip(input) {
                        *value = exp(input);
                    }
                }
            }
        }
        for v in chunks.into_remainder() {
            *v = exp(*v);
        }
    }
}

/// [`avx2`]'s steps on eight values in one AVX-512 register of doubles:
/// each lane does the same operations, so the bits are the same.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{exp, C0, C1, C2, INV_LN2_32, OVERFLOW, SHIFT, TABLE, UNDERFLOW};

    /// Eight f32 values through [`exp`]'s steps in double precision; lanes
    /// outside `[UNDERFLOW, OVERFLOW]` (or NaN) are left for the caller.
    #[target_feature(enable = "avx512f")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let xd = _mm512_cvtps_pd(x);
        let inv_ln2 = _mm512_set1_pd(INV_LN2_32);
        let rounded = _mm512_fmadd_pd(inv_ln2, xd, _mm512_set1_pd(SHIFT));
        let k = _mm512_castpd_si512(rounded);
        let kd = _mm512_sub_pd(rounded, _mm512_set1_pd(SHIFT));
        let r = _mm512_fmsub_pd(inv_ln2, xd, kd);
        let index = _mm512_and_si512(k, _mm512_set1_epi64(31));
        let entry = _mm512_i64gather_epi64::<8>(index, TABLE.as_ptr().cast::<i64>());
        let scale = _mm512_castsi512_pd(_mm512_add_epi64(entry, _mm512_slli_epi64::<47>(k)));
        let p = _mm512_fmadd_pd(_mm512_set1_pd(C0), r, _mm512_set1_pd(C1));
        let y = _mm512_fmadd_pd(_mm512_set1_pd(C2), r, _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(p, _mm512_mul_pd(r, r), y);
        _mm512_cvtpd_ps(_mm512_mul_pd(y, scale))
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_in_place(x: &mut [f32]) {
        let (low, high) = (_mm256_set1_ps(UNDERFLOW), _mm256_set1_ps(OVERFLOW));
        let mut chunks = x.chunks_exact_mut(8);
        for chunk in &mut chunks {
            let v = _mm256_loadu_ps(chunk.as_ptr());
            let out = exp8(v);
            // Ordered comparisons: NaN lanes count as out of range.
            let inside = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GE_OQ>(v, low),
                _mm256_cmp_ps::<_CMP_LE_OQ>(v, high),
            );
            _mm256_storeu_ps(chunk.as_mut_ptr(), out);
            if _mm256_movemask_ps(inside) != 0xff {
                // Some lane needs the special cases: redo all eight.
                let input: [f32; 8] = std::mem::transmute(v);
                for (value, input) in chunk.iter_mut().zip(input) {
                    *value = exp(input);
                }
            }
        }
        for v in chunks.into_remainder() {
            *v = exp(*v);
        }
    }
}

/// The `libm` crate's `expf` constants (FreeBSD's `e_expf.c`), for the
/// vectorised paths.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod freebsd {
    pub(super) const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    pub(super) const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    pub(super) const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
    pub(super) const P1: f32 = f32::from_bits(0x3e2a_aa8f);
    pub(super) const P2: f32 = f32::from_bits(0xbb35_5215);
}

#[cfg(target_arch = "x86_64")]
mod avx2_libm {
    use std::arch::x86_64::*;

    use super::freebsd::{INV_LN2, LN2_HI, LN2_LO, P1, P2};

    /// Eight lanes of `libm::expf`'s common path: `|x|` in `(2^-13, 86.6]`
    /// (its argument reduction by `k ln 2`, the rational approximation, then
    /// a scaling by `2^k` that one multiplication does exactly), `1 + x` for
    /// `|x|` up to `2^-13` (a softmax row's maximum gives 0), and `+0`
    /// below `-103.97` (`-inf` included). Returns the values and a mask of
    /// the lanes that it did not cover.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn exp8(x: __m256) -> (__m256, i32) {
        let bits = _mm256_castps_si256(x);
        let abs = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fff_ffff));
        let negative = _mm256_srai_epi32::<31>(bits); // all ones where the sign is set
        let above = |t: i32| _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(t));
        // k: round(x / ln 2) above 1.5 ln 2, +-1 above 0.5 ln 2, else 0.
        let half = _mm256_blendv_ps(
            _mm256_set1_ps(0.5),
            _mm256_set1_ps(-0.5),
            _mm256_castsi256_ps(negative),
        );
        let k_far = _mm256_cvttps_epi32(_mm256_add_ps(
            _mm256_mul_ps(_mm256_set1_ps(INV_LN2), x),
            half,
        ));
        let k_near = _mm256_or_si256(_mm256_set1_epi32(1), negative); // 1, or -1 where negative
        let k = _mm256_blendv_epi8(
            _mm256_and_si256(k_near, above(0x3eb1_7218)),
            k_far,
            above(0x3f85_1592),
        );
        let kf = _mm256_cvtepi32_ps(k);
        let hi = _mm256_sub_ps(x, _mm256_mul_ps(kf, _mm256_set1_ps(LN2_HI)));
        let lo = _mm256_mul_ps(kf, _mm256_set1_ps(LN2_LO));
        let r = _mm256_sub_ps(hi, lo);
        let rr = _mm256_mul_ps(r, r);
        let c = _mm256_sub_ps(
            r,
            _mm256_mul_ps(
                rr,
                _mm256_add_ps(_mm256_set1_ps(P1), _mm256_mul_ps(rr, _mm256_set1_ps(P2))),
            ),
        );
        let quotient = _mm256_div_ps(_mm256_mul_ps(r, c), _mm256_sub_ps(_mm256_set1_ps(2.0), c));
        let y = _mm256_add_ps(
            _mm256_set1_ps(1.0),
            _mm256_add_ps(_mm256_sub_ps(quotient, lo), hi),
        );
        // 2^k as a float (k within the normal exponents in the covered range).
        let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            k,
            _mm256_set1_epi32(127),
        )));
        let mut out = _mm256_mul_ps(y, scale);
        // Below -103.97 (and -inf, not NaN): +0.
        let underflow = _mm256_andnot_si256(
            above(0x7f80_0000),
            _mm256_and_si256(above(0x42cf_f1b4), negative),
        );
        out = _mm256_andnot_ps(_mm256_castsi256_ps(underflow), out);
        // |x| up to 2^-13 (zeros included): `1 + x`.
        let small = _mm256_andnot_si256(above(0x3900_0000), _mm256_set1_epi32(-1));
        out = _mm256_blendv_ps(
            out,
            _mm256_add_ps(_mm256_set1_ps(1.0), x),
            _mm256_castsi256_ps(small),
        );
        // Covered: |x| in (2^-13, 86.6] (k >= -125), the underflow, or small.
        let covered = _mm256_or_si256(
            _mm256_or_si256(
                _mm256_andnot_si256(above(0x42ad_3333), above(0x3900_0000)),
                underflow,
            ),
            small,
        );
        let uncovered = !_mm256_movemask_ps(_mm256_castsi256_ps(covered)) & 0xff;
        (out, uncovered)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn libm_exp_in_place(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(8);
        for chunk in &mut chunks {
            let v = _mm256_loadu_ps(chunk.as_ptr());
            let (out, uncovered) = exp8(v);
            let input: [f32; 8] = std::mem::transmute(v);
            _mm256_storeu_ps(chunk.as_mut_ptr(), out);
            if uncovered != 0 {
                for (lane, value) in chunk.iter_mut().enumerate() {
                    if uncovered & (1 << lane) != 0 {
                        *value = libm::expf(input[lane]);
                    }
                }
            }
        }
        // The last few values: padded to a full register.
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut lanes = [0.0f32; 8];
            lanes[..rest.len()].copy_from_slice(rest);
            let (out, uncovered) = exp8(_mm256_loadu_ps(lanes.as_ptr()));
            let out: [f32; 8] = std::mem::transmute(out);
            for (lane, value) in rest.iter_mut().enumerate() {
                *value = if uncovered & (1 << lane) != 0 {
                    libm::expf(lanes[lane])
                } else {
                    out[lane]
                };
            }
        }
    }
}

/// [`avx2_libm`]'s steps on four lanes of a NEON register (64-bit ARM),
/// unfused: each lane does the same operations, so the bits are the same.
#[cfg(target_arch = "aarch64")]
mod neon_libm {
    use std::arch::aarch64::*;

    use super::freebsd::{INV_LN2, LN2_HI, LN2_LO, P1, P2};

    /// Four lanes of `libm::expf`'s common path, as `avx2_libm::exp8`
    /// covers it. Returns the values and a mask of the lanes (bit `i` for
    /// lane `i`) that it did not cover.
    #[inline]
    fn exp4(x: float32x4_t) -> (float32x4_t, u32) {
        // SAFETY: NEON is part of aarch64's base instruction set; these
        // intrinsics only compute on registers.
        unsafe {
            let bits = vreinterpretq_s32_f32(x);
            let abs = vandq_s32(bits, vdupq_n_s32(0x7fff_ffff));
            let negative = vcltq_s32(bits, vdupq_n_s32(0)); // all ones where the sign is set
            let above = |t: i32| vcgtq_s32(abs, vdupq_n_s32(t));
            // k: round(x / ln 2) above 1.5 ln 2, +-1 above 0.5 ln 2, else 0.
            let half = vbslq_f32(negative, vdupq_n_f32(-0.5), vdupq_n_f32(0.5));
            let k_far = vcvtq_s32_f32(vaddq_f32(vmulq_f32(vdupq_n_f32(INV_LN2), x), half));
            let k_near = vbslq_s32(negative, vdupq_n_s32(-1), vdupq_n_s32(1));
            let k_near = vandq_s32(k_near, vreinterpretq_s32_u32(above(0x3eb1_7218)));
            let k = vbslq_s32(above(0x3f85_1592), k_far, k_near);
            let kf = vcvtq_f32_s32(k);
            let hi = vsubq_f32(x, vmulq_f32(kf, vdupq_n_f32(LN2_HI)));
            let lo = vmulq_f32(kf, vdupq_n_f32(LN2_LO));
            let r = vsubq_f32(hi, lo);
            let rr = vmulq_f32(r, r);
            let c = vsubq_f32(
                r,
                vmulq_f32(
                    rr,
                    vaddq_f32(vdupq_n_f32(P1), vmulq_f32(rr, vdupq_n_f32(P2))),
                ),
            );
            let quotient = vdivq_f32(vmulq_f32(r, c), vsubq_f32(vdupq_n_f32(2.0), c));
            let y = vaddq_f32(vdupq_n_f32(1.0), vaddq_f32(vsubq_f32(quotient, lo), hi));
            // 2^k as a float (k within the normal exponents in the covered range).
            let scale = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(k, vdupq_n_s32(127))));
            let out = vmulq_f32(y, scale);
            // Below -103.97 (and -inf, not NaN): +0.
            let underflow = vandq_u32(
                vandq_u32(vmvnq_u32(above(0x7f80_0000)), above(0x42cf_f1b4)),
                negative,
            );
            let out = vbslq_f32(underflow, vdupq_n_f32(0.0), out);
            // |x| up to 2^-13 (zeros included): `1 + x`.
            let small = vmvnq_u32(above(0x3900_0000));
            let out = vbslq_f32(small, vaddq_f32(vdupq_n_f32(1.0), x), out);
            // Covered: |x| in (2^-13, 86.6] (k >= -125), the underflow, or small.
            let inside = vandq_u32(above(0x3900_0000), vmvnq_u32(above(0x42ad_3333)));
            let covered = vorrq_u32(vorrq_u32(inside, underflow), small);
            let lanes: [u32; 4] = std::mem::transmute(covered);
            let uncovered = (0..4).filter(|&i| lanes[i] == 0).fold(0, |m, i| m | 1 << i);
            (out, uncovered)
        }
    }

    /// Four values at a time through [`exp4`], the lanes it does not cover
    /// through `libm::expf`; the last few padded to a full register.
    pub(super) fn libm_exp_in_place(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(4);
        for chunk in &mut chunks {
            // SAFETY: `chunk` holds four values; NEON is always present.
            let v = unsafe { vld1q_f32(chunk.as_ptr()) };
            let (out, uncovered) = exp4(v);
            // SAFETY: as above.
            unsafe { vst1q_f32(chunk.as_mut_ptr(), out) };
            if uncovered != 0 {
                // SAFETY: float32x4_t and [f32; 4] have the same size.
                let input: [f32; 4] = unsafe { std::mem::transmute(v) };
                for (lane, value) in chunk.iter_mut().enumerate() {
                    if uncovered & (1 << lane) != 0 {
                        *value = libm::expf(input[lane]);
                    }
                }
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut lanes = [0.0f32; 4];
            lanes[..rest.len()].copy_from_slice(rest);
            // SAFETY: `lanes` holds four values; NEON is always present.
            let (out, uncovered) = exp4(unsafe { vld1q_f32(lanes.as_ptr()) });
            // SAFETY: float32x4_t and [f32; 4] have the same size.
            let out: [f32; 4] = unsafe { std::mem::transmute(out) };
            for (lane, value) in rest.iter_mut().enumerate() {
                *value = if uncovered & (1 << lane) != 0 {
                    libm::expf(lanes[lane])
                } else {
                    out[lane]
                };
            }
        }
    }
}

/// [`avx2_libm`]'s steps on sixteen lanes of an AVX-512 register, the
/// lane selections done with mask registers: each lane does the same
/// operations, unfused, so the bits are the same.
#[cfg(target_arch = "x86_64")]
mod avx512_libm {
    use std::arch::x86_64::*;

    use super::freebsd::{INV_LN2, LN2_HI, LN2_LO, P1, P2};

    /// Sixteen lanes of `libm::expf`'s common path, as `avx2_libm::exp8`
    /// covers it. Returns the values and a mask of the lanes that it did not
    /// cover.
    #[target_feature(enable = "avx512f")]
    unsafe fn exp16(x: __m512) -> (__m512, __mmask16) {
        let bits = _mm512_castps_si512(x);
        let abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fff_ffff));
        let negative = _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512());
        let above = |t: i32| _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(t));
        // k: round(x / ln 2) above 1.5 ln 2, +-1 above 0.5 ln 2, else 0.
        let half = _mm512_mask_blend_ps(negative, _mm512_set1_ps(0.5), _mm512_set1_ps(-0.5));
        let k_far = _mm512_cvttps_epi32(_mm512_add_ps(
            _mm512_mul_ps(_mm512_set1_ps(INV_LN2), x),
            half,
        ));
        let k_near = _mm512_mask_blend_epi32(negative, _mm512_set1_epi32(1), _mm512_set1_epi32(-1));
        let k = _mm512_mask_blend_epi32(
            above(0x3f85_1592),
            _mm512_maskz_mov_epi32(above(0x3eb1_7218), k_near),
            k_far,
        );
        let kf = _mm512_cvtepi32_ps(k);
        let hi = _mm512_sub_ps(x, _mm512_mul_ps(kf, _mm512_set1_ps(LN2_HI)));
        let lo = _mm512_mul_ps(kf, _mm512_set1_ps(LN2_LO));
        let r = _mm512_sub_ps(hi, lo);
        let rr = _mm512_mul_ps(r, r);
        let c = _mm512_sub_ps(
            r,
            _mm512_mul_ps(
                rr,
                _mm512_add_ps(_mm512_set1_ps(P1), _mm512_mul_ps(rr, _mm512_set1_ps(P2))),
            ),
        );
        let quotient = _mm512_div_ps(_mm512_mul_ps(r, c), _mm512_sub_ps(_mm512_set1_ps(2.0), c));
        let y = _mm512_add_ps(
            _mm512_set1_ps(1.0),
            _mm512_add_ps(_mm512_sub_ps(quotient, lo), hi),
        );
        // 2^k as a float (k within the normal exponents in the covered range).
        let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            k,
            _mm512_set1_epi32(127),
        )));
        // Below -103.97 (and -inf, not NaN): +0.
        let underflow = !above(0x7f80_0000) & above(0x42cf_f1b4) & negative;
        let out = _mm512_maskz_mov_ps(!underflow, _mm512_mul_ps(y, scale));
        // |x| up to 2^-13 (zeros included): `1 + x`.
        let small = !above(0x3900_0000);
        let out = _mm512_mask_blend_ps(small, out, _mm512_add_ps(_mm512_set1_ps(1.0), x));
        // Covered: |x| in (2^-13, 86.6] (k >= -125), the underflow, or small.
        let covered = (above(0x3900_0000) & !above(0x42ad_3333)) | underflow | small;
        (out, !covered)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn libm_exp_in_place(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(16);
        for chunk in &mut chunks {
            let v = _mm512_loadu_ps(chunk.as_ptr());
            let (out, uncovered) = exp16(v);
            _mm512_storeu_ps(chunk.as_mut_ptr(), out);
            if uncovered != 0 {
                let input: [f32; 16] = std::mem::transmute(v);
                for (lane, value) in chunk.iter_mut().enumerate() {
                    if uncovered & (1 << lane) != 0 {
                        *value = libm::expf(input[lane]);
                    }
                }
            }
        }
        // The last few values: a masked load and store (the other lanes
        // are zeros, which the common path covers).
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let live: __mmask16 = (1 << rest.len()) - 1;
            let v = _mm512_maskz_loadu_ps(live, rest.as_ptr());
            let (out, uncovered) = exp16(v);
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), live, out);
            let input: [f32; 16] = std::mem::transmute(v);
            for (lane, value) in rest.iter_mut().enumerate() {
                if uncovered & (1 << lane) != 0 {
                    *value = libm::expf(input[lane]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs and the bits of glibc 2.36's `expf` for them.
    const PINNED: [(f32, u32); 12] = [
        (0.0, 0x3f80_0000),
        (1.0, 0x402d_f854),
        (-1.0, 0x3ebc_5ab2),
        (0.5, 0x3fd3_094c),
        (-0.3, 0x3f3d_a643),
        (10.5, 0x470d_db81),
        (-87.5, 0x006c_b2bc),
        (88.5, 0x7f4c_dcc4),
        (-103.5, 0x0000_0001),
        (-20.25, 0x30dc_9ef1),
        (3.3e-5, 0x3f80_0115),
        (42.0, 0x5dc1_192b),
    ];

    /// Every `stride`-th f32 bit pattern.
    fn sample(stride: usize) -> impl Iterator<Item = f32> {
        (0..=u32::MAX).step_by(stride).map(f32::from_bits)
    }

    #[test]
    fn pinned_values() {
        // Bits of glibc 2.36's expf, recorded once, so that the port stays
        // pinned whatever C library runs the tests.
        for (x, bits) in PINNED {
            assert_eq!(exp(x).to_bits(), bits, "exp({x:e})");
        }
        assert_eq!(exp(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(-110.0).to_bits(), 0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn matches_the_c_library_on_a_sample_of_every_f32() {
        for x in sample(4099) {
            let want = x.exp();
            let got = exp(x);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "exp({x:e}) = {got:e}, the C library gives {want:e}"
            );
        }
    }

    #[test]
    fn the_vectorised_path_gives_the_scalar_bits() {
        let inputs: Vec<f32> = sample(65_537)
            .chain([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 88.72, -103.97])
            .collect();
        for (path, exp_in_place) in exp_paths() {
            let mut vectorised = inputs.clone();
            // Every length of a partial last register, and the rest whole.
            let mut rest = vectorised.as_mut_slice();
            for len in 1..=8 {
                let (part, after) = rest.split_at_mut(len);
                exp_in_place(part);
                rest = after;
            }
            exp_in_place(rest);
            for (x, got) in inputs.iter().zip(&vectorised) {
                let want = exp(*x);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "exp({x:e}): {path} {got:e}, scalar {want:e}"
                );
            }
        }
        let mut sigmoids = vec![MaybeUninit::uninit(); inputs.len()];
        let sigmoids = sigmoid_into(&inputs, &mut sigmoids);
        for (x, got) in inputs.iter().zip(sigmoids.iter()) {
            let want = sigmoid(*x);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
        }
    }

    #[test]
    fn the_vectorised_libm_path_gives_libm_bits() {
        let inputs: Vec<f32> = sample(65_537)
            .chain([
                f32::NAN,
                -f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                0.0,
                -0.0,
            ])
            .chain([
                86.6, -86.6, 87.5, -87.5, -103.97, -104.0, 1e-5, -1e-5, 0.4, -0.4, 1.2e-4, -1.2e-4,
                1.3e-4, 1e-40,
            ])
            .collect();
        for (path, libm_exp_in_place) in libm_exp_paths() {
            let mut vectorised = inputs.clone();
            // Every length of a partial last register, and the rest whole.
            let mut rest = vectorised.as_mut_slice();
            for len in 1..=16 {
                let (part, after) = rest.split_at_mut(len);
                libm_exp_in_place(part);
                rest = after;
            }
            libm_exp_in_place(rest);
            for (x, got) in inputs.iter().zip(&vectorised) {
                let want = libm::expf(*x);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "expf({x:e}): {path} {got:e}, libm {want:e}"
                );
            }
        }
    }

    /// An implementation of an in-place exponential, by name.
    type Path = (&'static str, fn(&mut [f32]));

    /// [`exp_in_place`] and each vectorised path this CPU can run, by name
    /// (the dispatched one takes only the widest).
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_mut)
    )] // pushed to on x86-64 and 64-bit ARM only
    fn exp_paths() -> Vec<Path> {
        let mut paths: Vec<Path> = vec![("dispatched", exp_in_place)];
        #[cfg(target_arch = "aarch64")]
        paths.push(("neon", neon::exp_in_place));
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                // SAFETY: AVX2 and FMA are present (checked just above).
                paths.push(("avx2", |x| unsafe { avx2::exp_in_place(x) }));
            }
            if has!("avx512f") {
                // SAFETY: AVX-512F is present (checked just above).
                paths.push(("avx512f", |x| unsafe { avx512::exp_in_place(x) }));
            }
        }
        paths
    }

    /// [`libm_exp_in_place`] and each vectorised path this CPU can run.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_mut)
    )] // pushed to on x86-64 and 64-bit ARM only
    fn libm_exp_paths() -> Vec<Path> {
        let mut paths: Vec<Path> = vec![("dispatched", libm_exp_in_place)];
        #[cfg(target_arch = "aarch64")]
        paths.push(("neon", neon_libm::libm_exp_in_place));
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") {
                // SAFETY: AVX2 is present (checked just above).
                paths.push(("avx2", |x| unsafe { avx2_libm::libm_exp_in_place(x) }));
            }
            if has!("avx512f") {
                // SAFETY: AVX-512F is present (checked just above).
                paths.push(("avx512f", |x| unsafe { avx512_libm::libm_exp_in_place(x) }));
            }
        }
        paths
    }

    /// Every f32 input, a million at a time, through `vectorised` against
    /// `scalar` per value.
    fn every_f32_agrees(vectorised: fn(&mut [f32]), scalar: fn(f32) -> f32) {
        let mut block = vec![0.0f32; 1 << 20];
        for start in (0..=u32::MAX).step_by(1 << 20) {
            for (i, v) in block.iter_mut().enumerate() {
                *v = f32::from_bits(start + i as u32);
            }
            // Split so that both parts end in a partial register.
            let (head, tail) = block.split_at_mut((1 << 20) - 3);
            vectorised(head);
            vectorised(tail);
            for (i, got) in block.iter().enumerate() {
                let want = scalar(f32::from_bits(start + i as u32));
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "input bits {:#010x}",
                    start + i as u32
                );
            }
        }
    }

    /// Every f32 input through the vectorised `libm` path against `libm`
    /// itself (`just check-expf`).
    #[test]
    #[ignore]
    fn the_vectorised_libm_path_gives_libm_bits_on_every_f32() {
        for (path, vectorised) in libm_exp_paths().into_iter().skip(1) {
            eprintln!("every f32 through the {path} path");
            every_f32_agrees(vectorised, libm::expf);
        }
    }

    /// Every f32 input through the vectorised path against the scalar one
    /// (`just check-expf`).
    #[test]
    #[ignore]
    fn the_vectorised_path_gives_the_scalar_bits_on_every_f32() {
        for (path, vectorised) in exp_paths().into_iter().skip(1) {
            eprintln!("every f32 through the {path} path");
            every_f32_agrees(vectorised, exp);
        }
    }

    /// Every f32 input against the C library (`just check-expf`; about half
    /// a minute in release).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    #[ignore]
    fn matches_the_c_library_on_every_f32() {
        let mismatches: Vec<f32> = (0..=u32::MAX)
            .map(f32::from_bits)
            .filter(|x| {
                let (got, want) = (exp(*x), x.exp());
                got.to_bits() != want.to_bits() && !(got.is_nan() && want.is_nan())
            })
            .collect();
        assert!(
            mismatches.is_empty(),
            "{} inputs differ, e.g. {:?}",
            mismatches.len(),
            mismatches
                .iter()
                .take(8)
                .map(|x| format!(
                    "exp({x:e}) = {:e}, the C library gives {:e}",
                    exp(*x),
                    x.exp()
                ))
                .collect::<Vec<_>>()
        );
    }
}
