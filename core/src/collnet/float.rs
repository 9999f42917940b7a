//! The narrow floating-point formats NCCL reduces (fp16, bf16, fp8 e4m3 and e5m2): exact decoding
//! to `f32` and correctly rounded encoding from `f32`, written with integer operations only so the
//! result is the same on every machine.
//!
//! Encoding rounds to nearest, ties to even. What happens past the largest finite value follows
//! what CUDA does for each type, so a CollNet reduction matches the GPU's own conversions:
//! fp16 and bf16 overflow to ±infinity (IEEE); the fp8 types saturate to ±their largest finite
//! value (CUDA's `__NV_SATFINITE`, which `__nv_fp8_e4m3(float)` and `__nv_fp8_e5m2(float)` use),
//! infinities included. Every NaN encodes as the type's canonical quiet NaN with the sign bit
//! clear ([`Format::nan`]), so a NaN's bits never depend on which CPU produced it.

/// One small binary floating-point format: `exp_bits` exponent bits with an IEEE bias,
/// `man_bits` stored mantissa bits, a sign bit on top.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    exp_bits: u32,
    man_bits: u32,
    /// The all-ones exponent means infinity/NaN (IEEE); otherwise (e4m3) only the all-ones
    /// pattern is NaN and the all-ones exponent holds finite values.
    ieee_specials: bool,
    /// Past the largest finite value: `true` saturates (fp8, CUDA SATFINITE), `false` gives infinity.
    saturate: bool,
    /// Bit pattern of the canonical NaN (sign clear).
    nan: u16,
    /// Bit pattern of the largest finite value (sign clear).
    max_finite: u16,
}

/// IEEE binary16 (`__half`).
pub const FP16: Format = Format {
    exp_bits: 5,
    man_bits: 10,
    ieee_specials: true,
    saturate: false,
    nan: 0x7e00,
    max_finite: 0x7bff,
};

/// bfloat16 (`__nv_bfloat16`): the upper half of an `f32`.
pub const BF16: Format = Format {
    exp_bits: 8,
    man_bits: 7,
    ieee_specials: true,
    saturate: false,
    nan: 0x7fc0,
    max_finite: 0x7f7f,
};

/// OCP fp8 E4M3 (`__nv_fp8_e4m3`): no infinities, NaN only `S.1111.111`, largest 448.
pub const FP8_E4M3: Format = Format {
    exp_bits: 4,
    man_bits: 3,
    ieee_specials: false,
    saturate: true,
    nan: 0x7f,
    max_finite: 0x7e,
};

/// OCP fp8 E5M2 (`__nv_fp8_e5m2`): IEEE-like, largest finite 57344.
pub const FP8_E5M2: Format = Format {
    exp_bits: 5,
    man_bits: 2,
    ieee_specials: true,
    saturate: true,
    nan: 0x7f,
    max_finite: 0x7b,
};

impl Format {
    const fn bias(self) -> i32 {
        (1 << (self.exp_bits - 1)) - 1
    }

    /// The canonical NaN's bits.
    pub const fn nan(self) -> u16 {
        self.nan
    }

    /// The exact `f32` value of `bits` (only the format's low `1 + exp_bits + man_bits` bits are
    /// read). Every value of these formats is representable in `f32`.
    pub const fn decode(self, bits: u16) -> f32 {
        let m_bits = self.man_bits;
        let width = 1 + self.exp_bits + m_bits;
        let sign = ((bits as u32 >> (width - 1)) & 1) << 31;
        let exp_mask = (1u32 << self.exp_bits) - 1;
        let exp = (bits as u32 >> m_bits) & exp_mask;
        let man = bits as u32 & ((1u32 << m_bits) - 1);
        let magnitude = if exp == exp_mask && self.ieee_specials {
            if man == 0 { 0x7f80_0000 } else { 0x7fc0_0000 }
        } else if exp == exp_mask && man == (1u32 << m_bits) - 1 {
            // e4m3's only NaN.
            0x7fc0_0000
        } else if exp == 0 {
            if man == 0 {
                0
            } else {
                // Subnormal: man × 2^(1 − bias − M).
                let unit = 1 - self.bias() - m_bits as i32;
                let top = 31 - man.leading_zeros();
                let exponent = top as i32 + unit;
                if exponent + 127 <= 0 {
                    // Still subnormal in f32 (bf16's subnormals): f32's unit is 2^-149.
                    man << (unit + 149)
                } else {
                    // Normalise: the leading one at bit `top` becomes the implicit bit.
                    let fraction = (man & !(1u32 << top)) << (23 - top);
                    (((exponent + 127) as u32) << 23) | fraction
                }
            }
        } else {
            let exponent = exp as i32 - self.bias() + 127;
            ((exponent as u32) << 23) | (man << (23 - m_bits))
        };
        f32::from_bits(sign | magnitude)
    }

    /// `value` rounded to nearest (ties to even) in this format; overflow, infinities and NaN as
    /// the module documentation says.
    pub const fn encode(self, value: f32) -> u16 {
        let bits = value.to_bits();
        let sign_shift = self.exp_bits + self.man_bits;
        let sign = ((bits >> 31) as u16) << sign_shift;
        let abs = bits & 0x7fff_ffff;
        if abs > 0x7f80_0000 {
            return self.nan;
        }
        if abs == 0x7f80_0000 {
            return sign | self.overflow();
        }
        let exp32 = (abs >> 23) as i32;
        // f32 subnormals have no implicit bit and the exponent of the smallest normal.
        let (mantissa, exp32) = if exp32 == 0 {
            (abs & 0x7f_ffff, 1)
        } else {
            ((abs & 0x7f_ffff) | 0x80_0000, exp32)
        };
        let e = exp32 - 127 + self.bias();
        let (shift, high) = if e >= 1 {
            (23 - self.man_bits, ((e - 1) as u32) << self.man_bits)
        } else {
            (23 - self.man_bits + (1 - e) as u32, 0)
        };
        if shift > 24 {
            // Below half the smallest subnormal: rounds to (signed) zero.
            return sign;
        }
        let kept = mantissa >> shift;
        let rest = mantissa & ((1u32 << shift) - 1);
        let half = 1u32 << (shift - 1);
        let round_up = rest > half || (rest == half && kept & 1 == 1);
        // The implicit bit of `mantissa` lands in the exponent field: `high` holds e − 1.
        let magnitude = high + kept + round_up as u32;
        if magnitude > self.max_finite as u32 {
            return sign | self.overflow();
        }
        sign | magnitude as u16
    }

    /// The magnitude past the largest finite value: infinity, or the largest finite value.
    const fn overflow(self) -> u16 {
        if self.saturate {
            self.max_finite
        } else {
            // The all-ones exponent with a zero mantissa.
            (((1u32 << self.exp_bits) - 1) << self.man_bits) as u16
        }
    }
}

/// fp16 → `f32`, the same value as [`FP16`]`.decode` (NaN as `f32`'s canonical quiet NaN), in
/// straight-line integer and float operations the compiler turns into vector selects: the
/// exponent is rebiased in place; zero and subnormals go through one exact `f32` subtraction.
#[inline(always)]
pub fn fp16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let exp_man = (h & 0x7fff) << 13;
    let exp = exp_man & (0x1f << 23);
    let normal = f32::from_bits(exp_man + ((127 - 15) << 23));
    // exp 0: man × 2^-24 = (2^-14 + man × 2^-24) − 2^-14, both exact in f32.
    let small = f32::from_bits(exp_man + (113 << 23)) - f32::from_bits(113 << 23);
    let magnitude = if exp == 0 {
        small.to_bits()
    } else if exp == 0x1f << 23 {
        if exp_man & 0x7f_ffff == 0 {
            0x7f80_0000
        } else {
            0x7fc0_0000
        }
    } else {
        normal.to_bits()
    };
    f32::from_bits(sign | magnitude)
}

/// `f32` → fp16, the same bits as [`FP16`]`.encode` (round to nearest even, overflow to infinity,
/// NaN canonical): normal results by adding the rounding bias to the rebiased `f32` bits, results
/// below fp16's smallest normal by one exact `f32` addition that aligns the bits (IEEE
/// round-to-nearest-even does the rounding).
#[inline(always)]
pub fn f32_to_fp16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7fff_ffff;
    // Normal fp16 range: rebias the exponent, add 0x0fff plus the lowest kept bit, drop 13 bits.
    // A carry out of the mantissa bumps the exponent, up to infinity at 65520.
    let odd = (abs >> 13) & 1;
    let normal = (abs
        .wrapping_sub((127 - 15) << 23)
        .wrapping_add(0x0fff + odd)
        >> 13) as u16;
    // Below 2^-14: x + 0.5 puts the fp16 subnormal's bits at the bottom of the sum's mantissa.
    let small = (f32::from_bits(abs) + 0.5)
        .to_bits()
        .wrapping_sub(0x3f00_0000) as u16;
    let magnitude = if abs >= 0x4780_0000 {
        // 65536 and beyond (infinity too).
        0x7c00
    } else if abs < 0x3880_0000 {
        small
    } else {
        normal
    };
    if abs > 0x7f80_0000 {
        FP16.nan
    } else {
        sign | magnitude
    }
}

/// Decoding table of an 8-bit format (fp8): every value precomputed.
pub const fn table(format: Format) -> [f32; 256] {
    let mut out = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        out[i] = format.decode(i as u16);
        i += 1;
    }
    out
}

/// fp8 e4m3 values by bit pattern.
pub static E4M3_VALUES: [f32; 256] = table(FP8_E4M3);
/// fp8 e5m2 values by bit pattern.
pub static E5M2_VALUES: [f32; 256] = table(FP8_E5M2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_fp16_conversions_equal_the_reference_ones() {
        for h in 0..=u16::MAX {
            let fast = fp16_to_f32(h);
            let slow = FP16.decode(h);
            assert!(
                fast.to_bits() == slow.to_bits(),
                "decode {h:#06x}: {fast:?} vs {slow:?}"
            );
        }
        // Every fp16 value, the f32 values next to it and the midpoints to its neighbours (where
        // rounding decides), both signs; then a spread of arbitrary f32 bit patterns.
        let mut probes = alloc::vec::Vec::new();
        for h in 0..0x7c01u16 {
            let v = FP16.decode(h).to_bits();
            probes.extend([v, v.wrapping_add(1), v.wrapping_sub(1)]);
            if h < 0x7c00 {
                let next = FP16.decode(h + 1);
                let mid = ((f64::from(FP16.decode(h)) + f64::from(next)) / 2.0) as f32;
                let m = mid.to_bits();
                probes.extend([m, m + 1, m - 1]);
            }
        }
        let mut x = 0x9e37_79b9u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            probes.push(x);
        }
        probes.extend([
            0x7f80_0000,
            0x7fc0_0000,
            0x7f80_0001,
            0x4780_0000,
            0x477f_efff,
            0x477f_f000,
        ]);
        for bits in probes {
            for b in [bits & 0x7fff_ffff, bits | 0x8000_0000] {
                let x = f32::from_bits(b);
                assert_eq!(f32_to_fp16(x), FP16.encode(x), "encode {b:#010x} ({x:e})");
            }
        }
    }

    /// Reference rounding through `f64`: the exact value of `x`, scaled so one unit is the
    /// format's spacing at that magnitude, rounded with ties to even by explicit comparison.
    fn reference_encode(format: Format, x: f32) -> u16 {
        if x.is_nan() {
            return format.nan;
        }
        let sign: u16 = if x.is_sign_negative() {
            1 << (format.exp_bits + format.man_bits)
        } else {
            0
        };
        let ax = f64::from(x.abs());
        let max = f64::from(format.decode(format.max_finite));
        if ax > max {
            // Past the largest finite value: IEEE rounds to infinity from half an ulp beyond.
            let ulp = max - f64::from(format.decode(format.max_finite - 1));
            if !format.saturate && ax >= max + ulp / 2.0 {
                return sign | format.overflow();
            }
            return sign | format.max_finite;
        }
        // Positive values grow with their bits: binary search for the last one not above `ax`.
        let (mut lo, mut hi) = (0u16, format.max_finite);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if f64::from(format.decode(mid)) <= ax {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let below_bits = lo;
        let below = f64::from(format.decode(below_bits));
        let bits = if below_bits == format.max_finite || below == ax {
            below_bits
        } else {
            let above = f64::from(format.decode(below_bits + 1));
            let (d_below, d_above) = (ax - below, above - ax);
            if d_below < d_above || (d_below == d_above && below_bits & 1 == 0) {
                below_bits
            } else {
                below_bits + 1
            }
        };
        sign | bits
    }

    fn lcg(state: &mut u64) -> u32 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*state >> 32) as u32
    }

    #[test]
    fn fp8_round_trips_every_value() {
        for format in [FP8_E4M3, FP8_E5M2] {
            for bits in 0..=255u16 {
                let v = format.decode(bits);
                let back = format.encode(v);
                if v.is_nan() {
                    assert_eq!(back, format.nan);
                } else if v.is_infinite() {
                    // e5m2's infinities saturate (SATFINITE).
                    assert_eq!(back & 0x7f, format.max_finite);
                } else {
                    assert_eq!(back, bits, "{format:?} {bits:#x} = {v}");
                }
            }
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(FP8_E4M3.decode(0x7e), 448.0);
        assert_eq!(FP8_E4M3.decode(0x01), 2f32.powi(-9));
        assert_eq!(FP8_E5M2.decode(0x7b), 57344.0);
        assert_eq!(FP8_E5M2.decode(0x01), 2f32.powi(-16));
        assert_eq!(FP16.decode(0x7bff), 65504.0);
        assert_eq!(FP16.decode(0x0001), 2f32.powi(-24));
        assert_eq!(
            FP16.encode(65520.0),
            0x7c00,
            "half an ulp past the max is infinity"
        );
        assert_eq!(FP16.encode(65519.0), 0x7bff);
        assert_eq!(FP8_E4M3.encode(1000.0), 0x7e, "fp8 saturates");
        assert_eq!(FP8_E4M3.encode(f32::NEG_INFINITY), 0xfe);
        assert_eq!(BF16.encode(1.0), 0x3f80);
        assert_eq!(BF16.encode(f32::NAN), 0x7fc0);
        assert_eq!(FP16.encode(-0.0), 0x8000);
        // Ties to even: 1 + 2^-11 lies halfway between 1 and the next fp16 value.
        assert_eq!(FP16.encode(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(FP16.encode(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
    }

    #[test]
    fn every_fp16_and_bf16_value_round_trips() {
        for format in [FP16, BF16] {
            for bits in 0..=u16::MAX {
                let v = format.decode(bits);
                if v.is_nan() {
                    assert_eq!(format.encode(v), format.nan);
                } else {
                    assert_eq!(format.encode(v), bits, "{format:?} {bits:#x}");
                }
            }
        }
    }

    #[test]
    fn encoding_matches_the_nearest_value_search() {
        let mut state = 0x5eed;
        for format in [FP8_E4M3, FP8_E5M2, FP16, BF16] {
            // Values near the format's range, subnormals included, plus f32 subnormals.
            let rounds = 20000;
            for _ in 0..rounds {
                let r = lcg(&mut state);
                let x = match r % 4 {
                    0 => f32::from_bits(lcg(&mut state)),
                    1 => f32::from_bits(lcg(&mut state) & 0x807f_ffff),
                    _ => {
                        let scale = 2f32.powi((lcg(&mut state) % 48) as i32 - 30);
                        (lcg(&mut state) as f32 / u32::MAX as f32 - 0.5) * scale
                    }
                };
                assert_eq!(
                    format.encode(x),
                    reference_encode(format, x),
                    "{format:?} {x:e} ({:#x})",
                    x.to_bits()
                );
            }
            // Midpoints between neighbours (every one for fp8, every 97th for the 16-bit
            // formats), and one step either side of each.
            let step = if format.man_bits > 3 { 97 } else { 1 };
            for b in (0..format.max_finite).step_by(step) {
                let (lo, hi) = (format.decode(b), format.decode(b + 1));
                let mid = ((f64::from(lo) + f64::from(hi)) / 2.0) as f32;
                for x in [
                    mid,
                    f32::from_bits(mid.to_bits() + 1),
                    f32::from_bits(mid.to_bits().saturating_sub(1)),
                ] {
                    assert_eq!(format.encode(x), reference_encode(format, x), "{x:e}");
                }
            }
        }
    }
}
