//! The arithmetic of Rivet's CollNet: every NCCL data type × every built-in reduction operation,
//! over byte slices, with one definition every rank computes bit for bit alike.
//!
//! # Definition
//!
//! - **Order.** A reduction of the `n` contributions `x₀ … xₙ₋₁` to one element is a left fold,
//!   `((x_a ⊕ x_b) ⊕ x_c) ⊕ …`, in the order [`crate::collnet::layout`] fixes (it starts after
//!   the element's owner and ends with the owner). Floating-point `⊕` is not associative, so
//!   the order is part of the result; every rank gets the owner's bits.
//! - **Integers** (int8 … uint64): `sum` and `prod` wrap (two's complement), `min`/`max` as usual,
//!   `avg` is the wrapped sum divided by `n`, truncated toward zero.
//! - **fp32, fp64**: IEEE operations in the type itself, rounding to nearest-even per step.
//! - **fp16, bf16, fp8 e4m3, fp8 e5m2**: each step decodes both operands to `f32` exactly, applies
//!   the operation in `f32` and rounds the result once to the type ([`crate::collnet::float`]).
//!   The `f32` result of one `+`, `×` or `/` of two such values rounds correctly to the narrow type
//!   (`f32`'s 24 bits are at least twice the narrow precision plus two, so the double rounding is
//!   innocuous): every step is the correctly rounded operation of the narrow type.
//! - **min/max** of floats: a NaN operand gives NaN; `max(+0, −0) = +0` and `min(+0, −0) = −0`
//!   (IEEE 754-2019 `maximum`/`minimum`), so the result does not depend on operand order.
//! - **avg** of floats: the sum fold, then one division by `n` in the type's arithmetic (`f32` for
//!   the narrow types), rounded once.
//! - **NaN**: every NaN a step produces is stored as the type's canonical quiet NaN with the sign
//!   bit clear, so NaN bits do not depend on the CPU (x86 and Arm make different default NaNs).
//!
//! The loops run over `chunks_exact` of the element size with no allocation and no branch the
//! compiler cannot turn into a select, so they vectorise where the type allows (integers, fp32,
//! fp64, bf16); the narrow float types convert element by element.

use super::float::{BF16, E4M3_VALUES, E5M2_VALUES, FP8_E4M3, FP8_E5M2};
use core::fmt;

/// NCCL's `ncclDataType_t`, by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    /// `ncclInt8`.
    Int8 = 0,
    /// `ncclUint8`.
    Uint8 = 1,
    /// `ncclInt32`.
    Int32 = 2,
    /// `ncclUint32`.
    Uint32 = 3,
    /// `ncclInt64`.
    Int64 = 4,
    /// `ncclUint64`.
    Uint64 = 5,
    /// `ncclFloat16`.
    Float16 = 6,
    /// `ncclFloat32`.
    Float32 = 7,
    /// `ncclFloat64`.
    Float64 = 8,
    /// `ncclBfloat16`.
    Bfloat16 = 9,
    /// `ncclFloat8e4m3` (NCCL 2.24+).
    Float8E4M3 = 10,
    /// `ncclFloat8e5m2` (NCCL 2.24+).
    Float8E5M2 = 11,
}

impl DataType {
    /// Every type, in NCCL's numbering.
    pub const ALL: [Self; 12] = [
        Self::Int8,
        Self::Uint8,
        Self::Int32,
        Self::Uint32,
        Self::Int64,
        Self::Uint64,
        Self::Float16,
        Self::Float32,
        Self::Float64,
        Self::Bfloat16,
        Self::Float8E4M3,
        Self::Float8E5M2,
    ];

    /// The type NCCL's value `v` names, if any.
    pub fn from_nccl(v: i32) -> Option<Self> {
        usize::try_from(v)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Self::Int8 | Self::Uint8 | Self::Float8E4M3 | Self::Float8E5M2 => 1,
            Self::Float16 | Self::Bfloat16 => 2,
            Self::Int32 | Self::Uint32 | Self::Float32 => 4,
            Self::Int64 | Self::Uint64 | Self::Float64 => 8,
        }
    }

    /// NCCL's name for it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Int8 => "int8",
            Self::Uint8 => "uint8",
            Self::Int32 => "int32",
            Self::Uint32 => "uint32",
            Self::Int64 => "int64",
            Self::Uint64 => "uint64",
            Self::Float16 => "float16",
            Self::Float32 => "float32",
            Self::Float64 => "float64",
            Self::Bfloat16 => "bfloat16",
            Self::Float8E4M3 => "float8e4m3",
            Self::Float8E5M2 => "float8e5m2",
        }
    }

    /// Whether it is one of the fp8 types, which NCCL has from 2.24 (ABI v9) on.
    pub const fn is_fp8(self) -> bool {
        matches!(self, Self::Float8E4M3 | Self::Float8E5M2)
    }
}

/// NCCL's built-in `ncclRedOp_t`, by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RedOp {
    /// `ncclSum`.
    Sum = 0,
    /// `ncclProd`.
    Prod = 1,
    /// `ncclMax`.
    Max = 2,
    /// `ncclMin`.
    Min = 3,
    /// `ncclAvg`.
    Avg = 4,
}

impl RedOp {
    /// Every built-in operation, in NCCL's numbering.
    pub const ALL: [Self; 5] = [Self::Sum, Self::Prod, Self::Max, Self::Min, Self::Avg];

    /// The operation NCCL's value `v` names; `None` for user-defined (`ncclRedOpCreate*`) ones.
    pub fn from_nccl(v: i32) -> Option<Self> {
        usize::try_from(v)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// NCCL's name for it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Prod => "prod",
            Self::Max => "max",
            Self::Min => "min",
            Self::Avg => "avg",
        }
    }
}

/// Slices that do not fit the reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceError {
    /// The operands have different lengths.
    LengthMismatch {
        /// Bytes of the destination.
        dst: usize,
        /// Bytes of the other operand.
        other: usize,
    },
    /// A length is not a whole number of elements.
    Partial {
        /// The length.
        len: usize,
        /// The element size.
        elem: usize,
    },
    /// `avg` over no contributions.
    NoRanks,
}

impl fmt::Display for ReduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LengthMismatch { dst, other } => {
                write!(f, "operands of {dst} and {other} bytes differ in length")
            }
            Self::Partial { len, elem } => {
                write!(
                    f,
                    "{len} bytes is not a whole number of {elem}-byte elements"
                )
            }
            Self::NoRanks => f.write_str("an average over zero ranks"),
        }
    }
}

/// One element type's arithmetic.
trait Element: Copy {
    const SIZE: usize;
    /// Whether the kernels run in blocks of [`LANES`] (the types whose operations vectorise;
    /// the narrow floats' conversions do not, and blocks only spill their registers).
    const BLOCKED: bool = true;
    fn load(bytes: &[u8]) -> Self;
    fn store(self, bytes: &mut [u8]);
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    /// `self / n` (avg's last step).
    fn div(self, n: u32) -> Self;
}

macro_rules! int_element {
    ($t:ty) => {
        impl Element for $t {
            const SIZE: usize = size_of::<$t>();
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                <[u8; size_of::<$t>()]>::try_from(bytes).map_or(0, <$t>::from_ne_bytes)
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                if b > a { b } else { a }
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                if b < a { b } else { a }
            }
            #[inline(always)]
            fn div(self, n: u32) -> Self {
                // In i128 so every type's values and `n` fit; truncates toward zero.
                (self as i128 / i128::from(n)) as $t
            }
        }
    };
}
int_element!(i8);
int_element!(u8);
int_element!(i32);
int_element!(u32);
int_element!(i64);
int_element!(u64);

macro_rules! float_element {
    ($t:ty, $bits:ty, $nan:expr) => {
        impl Element for $t {
            const SIZE: usize = size_of::<$t>();
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                <[u8; size_of::<$t>()]>::try_from(bytes).map_or(0.0, <$t>::from_ne_bytes)
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                canonical(a + b)
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                canonical(a * b)
            }
            // Written as bit selects (no branch) so the blocked loops vectorise: each comparison
            // becomes an all-ones or all-zeros mask.
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                let (x, y) = (a.to_bits(), b.to_bits());
                let mask = |c: bool| <$bits>::from(c).wrapping_neg();
                // Equal (±0 or the same value): the sign bit only where both have it.
                let equal = x & y;
                let m = (x & mask(a > b)) | (y & mask(b > a)) | (equal & mask(a == b));
                let nan = mask(a.is_nan() | b.is_nan());
                <$t>::from_bits((m & !nan) | ($nan & nan))
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                let (x, y) = (a.to_bits(), b.to_bits());
                let mask = |c: bool| <$bits>::from(c).wrapping_neg();
                let equal = x | y;
                let m = (x & mask(a < b)) | (y & mask(b < a)) | (equal & mask(a == b));
                let nan = mask(a.is_nan() | b.is_nan());
                <$t>::from_bits((m & !nan) | ($nan & nan))
            }
            #[inline(always)]
            fn div(self, n: u32) -> Self {
                canonical(self / n as $t)
            }
        }

        impl Canonical for $t {
            #[inline(always)]
            fn canonical(self) -> Self {
                if self.is_nan() {
                    <$t>::from_bits($nan)
                } else {
                    self
                }
            }
        }
    };
}

trait Canonical {
    fn canonical(self) -> Self;
}

#[inline(always)]
fn canonical<T: Canonical>(x: T) -> T {
    x.canonical()
}

float_element!(f32, u32, 0x7fc0_0000);
float_element!(f64, u64, 0x7ff8_0000_0000_0000);

/// A narrow float type computed through `f32`: decode, operate, encode once.
macro_rules! narrow_element {
    ($name:ident, $storage:ty, $format:expr, $decode:expr) => {
        #[derive(Clone, Copy)]
        struct $name($storage);

        impl $name {
            #[inline(always)]
            fn get(self) -> f32 {
                $decode(self.0)
            }
            #[inline(always)]
            fn put(x: f32) -> Self {
                Self($format.encode(x) as $storage)
            }
        }

        impl Element for $name {
            const SIZE: usize = size_of::<$storage>();
            const BLOCKED: bool = false;
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                Self(
                    <[u8; size_of::<$storage>()]>::try_from(bytes)
                        .map_or(0, <$storage>::from_ne_bytes),
                )
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.0.to_ne_bytes());
            }
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                Self::put(a.get() + b.get())
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                Self::put(a.get() * b.get())
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Self::put(<f32 as Element>::max(a.get(), b.get()))
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Self::put(<f32 as Element>::min(a.get(), b.get()))
            }
            #[inline(always)]
            fn div(self, n: u32) -> Self {
                Self::put(self.get() / n as f32)
            }
        }
    };
}

#[inline(always)]
fn fp16_value(bits: u16) -> f32 {
    super::float::fp16_to_f32(bits)
}

/// fp16's encoder in its straight-line form ([`super::float::f32_to_fp16`], equal to the
/// generic [`super::float::Format::encode`] for every input).
struct Fp16Format;
impl Fp16Format {
    #[inline(always)]
    fn encode(&self, x: f32) -> u16 {
        super::float::f32_to_fp16(x)
    }
}
#[inline(always)]
fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}
#[inline(always)]
fn e4m3_value(bits: u8) -> f32 {
    E4M3_VALUES[usize::from(bits)]
}
#[inline(always)]
fn e5m2_value(bits: u8) -> f32 {
    E5M2_VALUES[usize::from(bits)]
}

/// bf16's encoder: round to nearest even on the upper half of the `f32` (the bits the generic
/// [`super::float::Format::encode`] gives, in a form that vectorises).
struct Bf16Format;
impl Bf16Format {
    #[inline(always)]
    const fn encode(&self, x: f32) -> u16 {
        let bits = x.to_bits();
        let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
        if x.is_nan() { BF16.nan() } else { rounded }
    }
}

narrow_element!(Fp16, u16, Fp16Format, fp16_value);
narrow_element!(Bf16, u16, Bf16Format, bf16_value);
narrow_element!(E4m3, u8, FP8_E4M3, e4m3_value);
narrow_element!(E5m2, u8, FP8_E5M2, e5m2_value);

/// Elements per block of the kernels' main loops: loads, operations and stores run over
/// fixed-size arrays, which the compiler turns into vector instructions.
const LANES: usize = 16;

/// `f` over one block of [`LANES`] elements: `dst[i] = f(lhs[i], rhs[i])`.
#[inline(always)]
fn block<T: Element>(dst: &mut [u8], lhs: &[u8], rhs: &[u8], f: &impl Fn(T, T) -> T) {
    let a: [T; LANES] = core::array::from_fn(|i| T::load(&lhs[i * T::SIZE..(i + 1) * T::SIZE]));
    let b: [T; LANES] = core::array::from_fn(|i| T::load(&rhs[i * T::SIZE..(i + 1) * T::SIZE]));
    let r: [T; LANES] = core::array::from_fn(|i| f(a[i], b[i]));
    for (i, v) in r.into_iter().enumerate() {
        v.store(&mut dst[i * T::SIZE..(i + 1) * T::SIZE]);
    }
}

#[inline(always)]
fn zip3<T: Element>(dst: &mut [u8], lhs: &[u8], rhs: &[u8], f: impl Fn(T, T) -> T) {
    let block_bytes = if T::BLOCKED { T::SIZE * LANES } else { T::SIZE };
    let whole = if T::BLOCKED {
        dst.len() / block_bytes * block_bytes
    } else {
        0
    };
    let (dst_blocks, dst_rest) = dst.split_at_mut(whole);
    let (lhs_blocks, lhs_rest) = lhs.split_at(whole.min(lhs.len()));
    let (rhs_blocks, rhs_rest) = rhs.split_at(whole.min(rhs.len()));
    for ((d, a), b) in dst_blocks
        .chunks_exact_mut(block_bytes)
        .zip(lhs_blocks.chunks_exact(block_bytes))
        .zip(rhs_blocks.chunks_exact(block_bytes))
    {
        block(d, a, b, &f);
    }
    for ((d, a), b) in dst_rest
        .chunks_exact_mut(T::SIZE)
        .zip(lhs_rest.chunks_exact(T::SIZE))
        .zip(rhs_rest.chunks_exact(T::SIZE))
    {
        f(T::load(a), T::load(b)).store(d);
    }
}

#[inline(always)]
fn zip2<T: Element>(acc: &mut [u8], rhs: &[u8], f: impl Fn(T, T) -> T) {
    let block_bytes = if T::BLOCKED { T::SIZE * LANES } else { T::SIZE };
    let whole = if T::BLOCKED {
        acc.len() / block_bytes * block_bytes
    } else {
        0
    };
    let (acc_blocks, acc_rest) = acc.split_at_mut(whole);
    let (rhs_blocks, rhs_rest) = rhs.split_at(whole.min(rhs.len()));
    for (d, b) in acc_blocks
        .chunks_exact_mut(block_bytes)
        .zip(rhs_blocks.chunks_exact(block_bytes))
    {
        let a: [T; LANES] = core::array::from_fn(|i| T::load(&d[i * T::SIZE..(i + 1) * T::SIZE]));
        let b: [T; LANES] = core::array::from_fn(|i| T::load(&b[i * T::SIZE..(i + 1) * T::SIZE]));
        let r: [T; LANES] = core::array::from_fn(|i| f(a[i], b[i]));
        for (i, v) in r.into_iter().enumerate() {
            v.store(&mut d[i * T::SIZE..(i + 1) * T::SIZE]);
        }
    }
    for (d, b) in acc_rest
        .chunks_exact_mut(T::SIZE)
        .zip(rhs_rest.chunks_exact(T::SIZE))
    {
        f(T::load(d), T::load(b)).store(d);
    }
}

fn combine_typed<T: Element>(op: RedOp, dst: &mut [u8], lhs: &[u8], rhs: &[u8]) {
    match op {
        RedOp::Sum | RedOp::Avg => zip3::<T>(dst, lhs, rhs, T::sum),
        RedOp::Prod => zip3::<T>(dst, lhs, rhs, T::prod),
        RedOp::Max => zip3::<T>(dst, lhs, rhs, T::max),
        RedOp::Min => zip3::<T>(dst, lhs, rhs, T::min),
    }
}

fn accumulate_typed<T: Element>(op: RedOp, acc: &mut [u8], rhs: &[u8]) {
    match op {
        RedOp::Sum | RedOp::Avg => zip2::<T>(acc, rhs, T::sum),
        RedOp::Prod => zip2::<T>(acc, rhs, T::prod),
        RedOp::Max => zip2::<T>(acc, rhs, T::max),
        RedOp::Min => zip2::<T>(acc, rhs, T::min),
    }
}

fn divide_typed<T: Element>(acc: &mut [u8], n: u32) {
    for d in acc.chunks_exact_mut(T::SIZE) {
        T::load(d).div(n).store(d);
    }
}

macro_rules! by_type {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DataType::Int8 => $f::<i8>($($arg),*),
            DataType::Uint8 => $f::<u8>($($arg),*),
            DataType::Int32 => $f::<i32>($($arg),*),
            DataType::Uint32 => $f::<u32>($($arg),*),
            DataType::Int64 => $f::<i64>($($arg),*),
            DataType::Uint64 => $f::<u64>($($arg),*),
            DataType::Float16 => $f::<Fp16>($($arg),*),
            DataType::Float32 => $f::<f32>($($arg),*),
            DataType::Float64 => $f::<f64>($($arg),*),
            DataType::Bfloat16 => $f::<Bf16>($($arg),*),
            DataType::Float8E4M3 => $f::<E4m3>($($arg),*),
            DataType::Float8E5M2 => $f::<E5m2>($($arg),*),
        }
    };
}

/// One data type and operation: the kernels a CollNet operation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction {
    /// Element type.
    pub dtype: DataType,
    /// Operation.
    pub op: RedOp,
}

impl Reduction {
    /// The reduction of `dtype` by `op`.
    pub const fn new(dtype: DataType, op: RedOp) -> Self {
        Self { dtype, op }
    }

    fn check(&self, dst: usize, other: usize) -> Result<(), ReduceError> {
        if dst != other {
            return Err(ReduceError::LengthMismatch { dst, other });
        }
        let elem = self.dtype.size();
        if dst % elem != 0 {
            return Err(ReduceError::Partial { len: dst, elem });
        }
        Ok(())
    }

    /// `dst[i] = lhs[i] ⊕ rhs[i]` (one step of the fold: `lhs` is the running value).
    pub fn combine(&self, dst: &mut [u8], lhs: &[u8], rhs: &[u8]) -> Result<(), ReduceError> {
        self.check(dst.len(), lhs.len())?;
        self.check(dst.len(), rhs.len())?;
        by_type!(self.dtype, combine_typed, self.op, dst, lhs, rhs);
        Ok(())
    }

    /// `acc[i] = acc[i] ⊕ rhs[i]`.
    pub fn accumulate(&self, acc: &mut [u8], rhs: &[u8]) -> Result<(), ReduceError> {
        self.check(acc.len(), rhs.len())?;
        by_type!(self.dtype, accumulate_typed, self.op, acc, rhs);
        Ok(())
    }

    /// The last step, after the fold over `nranks` contributions: `avg` divides by `nranks`;
    /// the other operations leave `acc` as it is.
    pub fn finish(&self, acc: &mut [u8], nranks: u32) -> Result<(), ReduceError> {
        self.check(acc.len(), acc.len())?;
        if self.op == RedOp::Avg {
            if nranks == 0 {
                return Err(ReduceError::NoRanks);
            }
            by_type!(self.dtype, divide_typed, acc, nranks);
        }
        Ok(())
    }

    /// The whole fold: `dst = finish(((in₀ ⊕ in₁) ⊕ in₂) ⊕ …)` over `count` inputs given in fold
    /// order by `input(k)`. `dst` must not be one of the inputs. One input is copied (and
    /// finished: an average over one rank is the value itself).
    pub fn fold<'a>(
        &self,
        dst: &mut [u8],
        count: usize,
        input: impl Fn(usize) -> &'a [u8],
    ) -> Result<(), ReduceError> {
        match count {
            0 => return Err(ReduceError::NoRanks),
            1 => {
                let only = input(0);
                self.check(dst.len(), only.len())?;
                dst.copy_from_slice(only);
            }
            _ => {
                self.combine(dst, input(0), input(1))?;
                for k in 2..count {
                    self.accumulate(dst, input(k))?;
                }
            }
        }
        self.finish(dst, count as u32)
    }
}

/// Whether Rivet implements `dtype` × `op`: every built-in pair is implemented; what NCCL may
/// ask depends only on which types it has (fp8 from 2.24, decided by the ABI shim).
pub const fn supported(_dtype: DataType, _op: RedOp) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collnet::float::FP16;
    use alloc::vec;
    use alloc::vec::Vec;

    fn bytes_of_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn f32s(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Element-wise reference of one step, written independently of the kernels: through `f64`
    /// for the floats (exact for sums and products of two `f32`s, then rounded once).
    fn reference_step(dtype: DataType, op: RedOp, a: &[u8], b: &[u8]) -> Vec<u8> {
        let size = dtype.size();
        let mut out = vec![0u8; a.len()];
        for i in (0..a.len()).step_by(size) {
            let (x, y) = (&a[i..i + size], &b[i..i + size]);
            let r: Vec<u8> = match dtype {
                DataType::Float32 => {
                    let (x, y) = (
                        f64::from(f32::from_ne_bytes(x.try_into().unwrap())),
                        f64::from(f32::from_ne_bytes(y.try_into().unwrap())),
                    );
                    let r = reference_float(op, x, y) as f32;
                    let r = if r.is_nan() {
                        f32::from_bits(0x7fc0_0000)
                    } else {
                        r
                    };
                    r.to_ne_bytes().to_vec()
                }
                DataType::Float16
                | DataType::Bfloat16
                | DataType::Float8E4M3
                | DataType::Float8E5M2 => {
                    let format = match dtype {
                        DataType::Float16 => FP16,
                        DataType::Bfloat16 => BF16,
                        DataType::Float8E4M3 => FP8_E4M3,
                        _ => FP8_E5M2,
                    };
                    let load = |s: &[u8]| -> u16 {
                        if size == 1 {
                            u16::from(s[0])
                        } else {
                            u16::from_ne_bytes(s.try_into().unwrap())
                        }
                    };
                    let (x, y) = (
                        f64::from(format.decode(load(x))),
                        f64::from(format.decode(load(y))),
                    );
                    // Exact in f64 for +, × of two narrow values; one rounding to f32 is
                    // innocuous before the rounding to the narrow type.
                    let r = format.encode(reference_float(op, x, y) as f32);
                    if size == 1 {
                        vec![r as u8]
                    } else {
                        r.to_ne_bytes().to_vec()
                    }
                }
                DataType::Int32 => {
                    let (x, y) = (
                        i32::from_ne_bytes(x.try_into().unwrap()),
                        i32::from_ne_bytes(y.try_into().unwrap()),
                    );
                    let r = match op {
                        RedOp::Sum | RedOp::Avg => x.wrapping_add(y),
                        RedOp::Prod => x.wrapping_mul(y),
                        RedOp::Max => x.max(y),
                        RedOp::Min => x.min(y),
                    };
                    r.to_ne_bytes().to_vec()
                }
                _ => unreachable!("reference covers the types tested"),
            };
            out[i..i + size].copy_from_slice(&r);
        }
        out
    }

    fn reference_float(op: RedOp, x: f64, y: f64) -> f64 {
        match op {
            RedOp::Sum | RedOp::Avg => x + y,
            RedOp::Prod => x * y,
            RedOp::Max | RedOp::Min if x.is_nan() || y.is_nan() => f64::NAN,
            RedOp::Max if x == y => {
                if x.is_sign_negative() && y.is_sign_negative() {
                    x
                } else {
                    x.abs()
                }
            }
            RedOp::Min if x == y => {
                if x.is_sign_negative() || y.is_sign_negative() {
                    -(x.abs())
                } else {
                    x
                }
            }
            RedOp::Max => x.max(y),
            RedOp::Min => x.min(y),
        }
    }

    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state
    }

    fn random_bytes(state: &mut u64, n: usize) -> Vec<u8> {
        (0..n).map(|_| (lcg(state) >> 33) as u8).collect()
    }

    #[test]
    fn every_step_matches_the_reference() {
        let mut state = 42;
        for dtype in [
            DataType::Float32,
            DataType::Float16,
            DataType::Bfloat16,
            DataType::Float8E4M3,
            DataType::Float8E5M2,
            DataType::Int32,
        ] {
            for op in RedOp::ALL {
                let n = 4096 * dtype.size();
                let (a, b) = (random_bytes(&mut state, n), random_bytes(&mut state, n));
                let r = Reduction::new(dtype, op);
                let mut dst = vec![0u8; n];
                r.combine(&mut dst, &a, &b).unwrap();
                let want = reference_step(dtype, op, &a, &b);
                // Compare NaN-aware: both canonical.
                assert_eq!(dst, want, "{} {}", dtype.name(), op.name());
                let mut acc = a.clone();
                r.accumulate(&mut acc, &b).unwrap();
                assert_eq!(acc, want, "accumulate {} {}", dtype.name(), op.name());
            }
        }
    }

    #[test]
    fn fold_order_is_left_to_right() {
        // (1e8 + 1) − 1e8 = 0 in f32 but 1e8 + (1 − 1e8) = 0 too; use values where order shows:
        // ((1e8 + −1e8) + 1) = 1, ((1e8 + 1) + −1e8) = 0.
        let r = Reduction::new(DataType::Float32, RedOp::Sum);
        let inputs = [
            bytes_of_f32(&[1e8]),
            bytes_of_f32(&[-1e8]),
            bytes_of_f32(&[1.0]),
        ];
        let mut dst = vec![0u8; 4];
        r.fold(&mut dst, 3, |k| &inputs[k]).unwrap();
        assert_eq!(f32s(&dst), [1.0]);
        r.fold(&mut dst, 3, |k| &inputs[[0, 2, 1][k]]).unwrap();
        assert_eq!(f32s(&dst), [0.0]);
    }

    #[test]
    fn integers_wrap_and_average_truncates() {
        let r = Reduction::new(DataType::Int8, RedOp::Sum);
        let mut dst = [0u8; 2];
        r.combine(&mut dst, &[100, 0x80], &[100, 0xff]).unwrap();
        assert_eq!(
            dst,
            [200, 0x7f],
            "100 + 100 wraps to −56; −128 + −1 wraps to 127"
        );
        let avg = Reduction::new(DataType::Int32, RedOp::Avg);
        let inputs: Vec<Vec<u8>> = [-7i32, 0, 0]
            .iter()
            .map(|v| v.to_ne_bytes().to_vec())
            .collect();
        let mut out = [0u8; 4];
        avg.fold(&mut out, 3, |k| &inputs[k]).unwrap();
        assert_eq!(i32::from_ne_bytes(out), -2, "−7 / 3 truncates toward zero");
        let avg = Reduction::new(DataType::Uint64, RedOp::Avg);
        let inputs: Vec<Vec<u8>> = [u64::MAX, 1]
            .iter()
            .map(|v| v.to_ne_bytes().to_vec())
            .collect();
        let mut out = [0u8; 8];
        avg.fold(&mut out, 2, |k| &inputs[k]).unwrap();
        assert_eq!(
            u64::from_ne_bytes(out),
            0,
            "the sum wraps to 0 before the division"
        );
    }

    #[test]
    fn min_max_handle_zeros_and_nan() {
        let max = Reduction::new(DataType::Float32, RedOp::Max);
        let min = Reduction::new(DataType::Float32, RedOp::Min);
        let mut dst = [0u8; 4];
        for (a, b) in [(0.0f32, -0.0f32), (-0.0, 0.0)] {
            max.combine(&mut dst, &a.to_ne_bytes(), &b.to_ne_bytes())
                .unwrap();
            assert_eq!(f32::from_ne_bytes(dst).to_bits(), 0, "max(±0) = +0");
            min.combine(&mut dst, &a.to_ne_bytes(), &b.to_ne_bytes())
                .unwrap();
            assert_eq!(
                f32::from_ne_bytes(dst).to_bits(),
                0x8000_0000,
                "min(±0) = −0"
            );
        }
        let nan = f32::from_bits(0xffc0_1234);
        max.combine(&mut dst, &nan.to_ne_bytes(), &1f32.to_ne_bytes())
            .unwrap();
        assert_eq!(u32::from_ne_bytes(dst), 0x7fc0_0000, "canonical NaN");
        let sum = Reduction::new(DataType::Float64, RedOp::Sum);
        let mut d8 = [0u8; 8];
        sum.combine(
            &mut d8,
            &f64::INFINITY.to_ne_bytes(),
            &f64::NEG_INFINITY.to_ne_bytes(),
        )
        .unwrap();
        assert_eq!(u64::from_ne_bytes(d8), 0x7ff8_0000_0000_0000);
    }

    #[test]
    fn narrow_avg_divides_once_in_f32() {
        let avg = Reduction::new(DataType::Float16, RedOp::Avg);
        let one = FP16.encode(1.0).to_ne_bytes();
        let two = FP16.encode(2.0).to_ne_bytes();
        let inputs = [one, one, two];
        let mut out = [0u8; 2];
        avg.fold(&mut out, 3, |k| &inputs[k]).unwrap();
        assert_eq!(u16::from_ne_bytes(out), FP16.encode(4.0 / 3.0));
    }

    #[test]
    fn bf16_fast_encoder_matches_the_generic_one() {
        let mut state = 7;
        for _ in 0..200_000 {
            let x = f32::from_bits((lcg(&mut state) >> 32) as u32);
            assert_eq!(Bf16Format.encode(x), BF16.encode(x), "{:#x}", x.to_bits());
        }
    }

    #[test]
    fn bad_lengths_are_errors() {
        let r = Reduction::new(DataType::Int32, RedOp::Sum);
        let mut dst = [0u8; 8];
        assert_eq!(
            r.combine(&mut dst, &[0; 8], &[0; 4]),
            Err(ReduceError::LengthMismatch { dst: 8, other: 4 })
        );
        let mut odd = [0u8; 6];
        assert!(matches!(
            r.accumulate(&mut odd, &[0; 6]),
            Err(ReduceError::Partial { len: 6, elem: 4 })
        ));
    }
}
