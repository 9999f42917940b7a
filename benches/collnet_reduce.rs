//! CollNet reduction throughput on one core: GB/s of one operand through
//! `Reduction::accumulate` (`acc = acc ⊕ rhs`, the step a fold repeats), for every NCCL data type
//! and operation, on buffers that fit the cache (256 KiB) and buffers that do not (32 MiB).
//!
//! Run: `cargo bench --bench collnet_reduce` (add `-- --quick` for fewer repetitions, or
//! `-- --size 1M` for one buffer size).

use rivet_core::collnet::reduce::{DataType, RedOp, Reduction};
use std::hint::black_box;
use std::time::Instant;

fn parse_size(s: &str) -> usize {
    let (num, mul) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    num.parse::<usize>().expect("size") * mul
}

/// Bytes that are finite, ordinary values of `dtype` (so the float paths measure arithmetic,
/// not NaN handling): small integers converted to the type.
fn operand(dtype: DataType, bytes: usize, seed: u32) -> Vec<u8> {
    let one = |i: usize| -> Vec<u8> {
        let v = ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 64) as f32 / 8.0 + 0.5;
        match dtype {
            DataType::Float32 => v.to_ne_bytes().to_vec(),
            DataType::Float64 => f64::from(v).to_ne_bytes().to_vec(),
            DataType::Float16 => rivet_core::collnet::float::FP16
                .encode(v)
                .to_ne_bytes()
                .to_vec(),
            DataType::Bfloat16 => rivet_core::collnet::float::BF16
                .encode(v)
                .to_ne_bytes()
                .to_vec(),
            DataType::Float8E4M3 => vec![rivet_core::collnet::float::FP8_E4M3.encode(v) as u8],
            DataType::Float8E5M2 => vec![rivet_core::collnet::float::FP8_E5M2.encode(v) as u8],
            _ => {
                let x = (v * 8.0) as u64;
                x.to_ne_bytes()[..dtype.size()].to_vec()
            }
        }
    };
    (0..bytes / dtype.size()).flat_map(one).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let sizes: Vec<usize> = match args.iter().position(|a| a == "--size") {
        Some(i) => vec![parse_size(&args[i + 1])],
        None => vec![256 << 10, 32 << 20],
    };
    let target_bytes: usize = if quick { 256 << 20 } else { 2 << 30 };
    println!("CollNet reduction throughput, one core, acc = acc (op) rhs; GB/s of one operand");
    print!("{:<12}", "type");
    for &size in &sizes {
        for op in RedOp::ALL {
            print!(" {:>9}", format!("{}@{}", op.name(), label(size)));
        }
    }
    println!();
    for dtype in DataType::ALL {
        print!("{:<12}", dtype.name());
        for &size in &sizes {
            let size = size / dtype.size() * dtype.size();
            let rhs = operand(dtype, size, 1);
            for op in RedOp::ALL {
                let r = Reduction::new(dtype, op);
                let mut acc = operand(dtype, size, 2);
                let reps = (target_bytes / size).max(3);
                // Warm-up, then timed: max/min keep the values bounded; sum/prod of small
                // values may grow to infinity in the float types, which the loop then carries
                // like any value (no NaN: inf ⊕ finite stays inf for sum and prod).
                r.accumulate(&mut acc, &rhs).expect("lengths");
                let start = Instant::now();
                for _ in 0..reps {
                    r.accumulate(black_box(&mut acc), black_box(&rhs))
                        .expect("lengths");
                }
                let secs = start.elapsed().as_secs_f64();
                let gbps = (reps * size) as f64 / secs / 1e9;
                print!(" {gbps:>9.2}");
            }
        }
        println!();
    }
}

fn label(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{}M", size >> 20)
    } else {
        format!("{}K", size >> 10)
    }
}
