//! ggml's tensor element types and their dequantisation to f32.
//!
//! Block layouts and formulas follow llama.cpp's `ggml-common.h` (the
//! `block_*` structs) and `ggml-quants.c` (`dequantize_row_*`); every
//! formula is evaluated in f32, in the order those functions use, without
//! fused multiply-adds, so the results equal the `gguf` Python package's
//! `gguf.quants.dequantize` bit for bit (tested against values it wrote,
//! `fixtures/gguf/`).

use half::{bf16, f16};

/// A ggml tensor type this crate can dequantise, with its GGUF code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    /// 32-bit floats (code 0).
    F32,
    /// IEEE half precision (code 1).
    F16,
    /// 32 weights: f16 scale, 4-bit values offset by 8 (code 2).
    Q4_0,
    /// 32 weights: f16 scale and min, 4-bit values (code 3).
    Q4_1,
    /// 32 weights: f16 scale, 5-bit values split into 4 low and 1 high bit (code 6).
    Q5_0,
    /// 32 weights: f16 scale, 8-bit values (code 8).
    Q8_0,
    /// 256 weights: super-block f16 scale and min, eight 6-bit sub-scales and mins, 4-bit values (code 12).
    Q4K,
    /// 256 weights: 6-bit values in 4 low and 2 high bits, sixteen 8-bit sub-scales, f16 scale (code 14).
    Q6K,
    /// bfloat16 (code 30).
    Bf16,
}

impl GgmlType {
    /// Every type this crate reads.
    pub const ALL: [GgmlType; 9] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ];

    /// The type of GGUF code `code`, or `None` when this crate cannot read it.
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.code() == code)
    }

    /// The type's code in a GGUF tensor info.
    pub fn code(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q6K => 14,
            GgmlType::Bf16 => 30,
        }
    }

    /// The name ggml gives the type (`Q4_K`, `BF16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Bf16 => "BF16",
        }
    }

    /// Elements per block.
    pub fn block_elements(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => 32,
            GgmlType::Q4K | GgmlType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4K => 144,
            GgmlType::Q6K => 210,
        }
    }

    /// Dequantises `bytes`, a whole number of blocks, appending to `out`.
    ///
    /// # Panics
    /// If `bytes.len()` is not a multiple of [`Self::block_bytes`] (the
    /// container checks sizes before calling this).
    pub fn dequantize(self, bytes: &[u8], out: &mut Vec<f32>) {
        let size = self.block_bytes();
        assert_eq!(
            bytes.len() % size,
            0,
            "{} data is not whole blocks",
            self.name()
        );
        out.reserve(bytes.len() / size * self.block_elements());
        for block in bytes.chunks_exact(size) {
            match self {
                GgmlType::F32 => {
                    out.push(f32::from_le_bytes([block[0], block[1], block[2], block[3]]))
                }
                GgmlType::F16 => out.push(half_at(block, 0)),
                GgmlType::Bf16 => out.push(bf16::from_bits(u16_at(block, 0)).to_f32()),
                GgmlType::Q8_0 => q8_0(block, out),
                GgmlType::Q4_0 => q4_0(block, out),
                GgmlType::Q4_1 => q4_1(block, out),
                GgmlType::Q5_0 => q5_0(block, out),
                GgmlType::Q4K => q4_k(block, out),
                GgmlType::Q6K => q6_k(block, out),
            }
        }
    }
}

/// The name of any GGUF type code, supported or not (for error messages).
pub fn code_name(code: u32) -> String {
    const NAMES: [(u32, &str); 21] = [
        (7, "Q5_1"),
        (9, "Q8_1"),
        (10, "Q2_K"),
        (11, "Q3_K"),
        (13, "Q5_K"),
        (15, "Q8_K"),
        (16, "IQ2_XXS"),
        (17, "IQ2_XS"),
        (18, "IQ3_XXS"),
        (19, "IQ1_S"),
        (20, "IQ4_NL"),
        (21, "IQ3_S"),
        (22, "IQ2_S"),
        (23, "IQ4_XS"),
        (24, "I8"),
        (25, "I16"),
        (26, "I32"),
        (27, "I64"),
        (28, "F64"),
        (29, "IQ1_M"),
        (39, "MXFP4"),
    ];
    match GgmlType::from_code(code) {
        Some(t) => t.name().to_string(),
        None => match NAMES.iter().find(|(c, _)| *c == code) {
            Some((_, name)) => format!("{name} (code {code})"),
            None => format!("unknown type code {code}"),
        },
    }
}

fn u16_at(block: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([block[at], block[at + 1]])
}

fn half_at(block: &[u8], at: usize) -> f32 {
    f16::from_bits(u16_at(block, at)).to_f32()
}

fn q8_0(block: &[u8], out: &mut Vec<f32>) {
    let d = half_at(block, 0);
    out.extend(block[2..34].iter().map(|&q| f32::from(q as i8) * d));
}

fn q4_0(block: &[u8], out: &mut Vec<f32>) {
    let d = half_at(block, 0);
    let qs = &block[2..18];
    out.extend(qs.iter().map(|&q| (i32::from(q & 0xF) - 8) as f32 * d));
    out.extend(qs.iter().map(|&q| (i32::from(q >> 4) - 8) as f32 * d));
}

fn q4_1(block: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half_at(block, 0), half_at(block, 2));
    let qs = &block[4..20];
    out.extend(qs.iter().map(|&q| f32::from(q & 0xF) * d + m));
    out.extend(qs.iter().map(|&q| f32::from(q >> 4) * d + m));
}

fn q5_0(block: &[u8], out: &mut Vec<f32>) {
    let d = half_at(block, 0);
    let h = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let qs = &block[6..22];
    let value = |low: u8, high: u32| ((u32::from(low) | high) as i32 - 16) as f32 * d;
    out.extend((0..16).map(|j| value(qs[j] & 0xF, ((h >> j) << 4) & 0x10)));
    out.extend((0..16).map(|j| value(qs[j] >> 4, (h >> (j + 12)) & 0x10)));
}

/// Scale and min of sub-block `j` of a Q4_K super-block (6 bits each,
/// packed in 12 bytes).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q4_k(block: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half_at(block, 0), half_at(block, 2));
    let scales = &block[4..16];
    let qs = &block[16..144];
    for chunk in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let q = &qs[32 * chunk..32 * chunk + 32];
        out.extend(q.iter().map(|&b| d1 * f32::from(b & 0xF) - min1));
        out.extend(q.iter().map(|&b| d2 * f32::from(b >> 4) - min2));
    }
}

fn q6_k(block: &[u8], out: &mut Vec<f32>) {
    let d = half_at(block, 208);
    let start = out.len();
    out.resize(start + 256, 0.0);
    let y_all = &mut out[start..];
    for half in 0..2 {
        let ql = &block[64 * half..64 * half + 64];
        let qh = &block[128 + 32 * half..128 + 32 * half + 32];
        let sc = &block[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y_all[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q = |low: u8, shift: u32| {
                (i32::from(low) | ((i32::from(qh[l] >> shift) & 3) << 4)) - 32
            };
            let scale = |k: usize| f32::from(sc[k] as i8);
            y[l] = d * scale(is) * q(ql[l] & 0xF, 0) as f32;
            y[l + 32] = d * scale(is + 2) * q(ql[l + 32] & 0xF, 2) as f32;
            y[l + 64] = d * scale(is + 4) * q(ql[l] >> 4, 4) as f32;
            y[l + 96] = d * scale(is + 6) * q(ql[l + 32] >> 4, 6) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_named() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_code(t.code()), Some(t));
        }
        assert_eq!(GgmlType::from_code(13), None);
        assert_eq!(code_name(13), "Q5_K (code 13)");
        assert_eq!(code_name(99), "unknown type code 99");
        assert_eq!(code_name(12), "Q4_K");
    }

    #[test]
    fn q8_0_is_scale_times_signed_byte() {
        let mut block = vec![0u8; 34];
        block[..2].copy_from_slice(&f16_bytes(0.5));
        block[2] = 4;
        block[3] = (-6i8) as u8;
        let mut out = Vec::new();
        GgmlType::Q8_0.dequantize(&block, &mut out);
        assert_eq!(out.len(), 32);
        assert_eq!(&out[..3], &[2.0, -3.0, 0.0]);
    }

    #[test]
    fn q4_1_puts_low_nibbles_first_and_adds_the_min() {
        let mut block = vec![0u8; 20];
        block[..2].copy_from_slice(&f16_bytes(2.0));
        block[2..4].copy_from_slice(&f16_bytes(-1.0));
        block[4] = 0x3A; // low 10, high 3
        let mut out = Vec::new();
        GgmlType::Q4_1.dequantize(&block, &mut out);
        assert_eq!((out[0], out[16], out[1]), (19.0, 5.0, -1.0));
    }

    #[test]
    fn q5_0_takes_the_fifth_bit_from_qh() {
        let mut block = vec![0u8; 22];
        block[..2].copy_from_slice(&f16_bytes(1.0));
        // Element 0's high bit (bit 0 of qh) and element 16's (bit 16).
        block[2..6].copy_from_slice(&(1u32 | 1 << 16).to_le_bytes());
        block[6] = 0x21; // element 0 low 1, element 16 low 2
        let mut out = Vec::new();
        GgmlType::Q5_0.dequantize(&block, &mut out);
        assert_eq!((out[0], out[16], out[1]), (1.0, 2.0, -16.0));
    }
}
