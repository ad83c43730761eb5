//! Prints a markdown table comparing the sparse log-quantized codec with raw
//! (key, value) pairs and zstd on those pairs, on a seeded heavy-tailed
//! ResNet-50-sized gradient: bytes per kept element, throughput beside a
//! plain copy measured in the same run, and value error.

use gradlane_tools::gradients as support;

use std::time::Instant;

use clap::{Parser, ValueEnum};
use gradlane::codec::{self, Selection, DEFAULT_BASE};
use support::{gradient, Dist, RESNET50};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DistArg {
    T3,
    Laplace,
    Cauchy,
}

/// Codec size / speed / error table (markdown on stdout).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Number of dense values (default: ResNet-50's parameter count).
    #[arg(long, default_value_t = RESNET50)]
    values: usize,
    /// Kept fractions (top-k), comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.01, 0.001])]
    density: Vec<f64>,
    /// Logarithm bases, comma separated (the default base is always added).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1.5, 2.0, 2.5, 4.0])]
    bases: Vec<f64>,
    /// PRNG seed of the synthetic gradient.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Timed repetitions per cell (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Distribution of the synthetic gradient.
    #[arg(long, value_enum, default_value_t = DistArg::T3)]
    dist: DistArg,
}

fn median_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let dist = match args.dist {
        DistArg::T3 => Dist::StudentT3,
        DistArg::Laplace => Dist::Laplace,
        DistArg::Cauchy => Dist::Cauchy,
    };
    let values = gradient(args.values, args.seed, dist);
    let dense_bytes = (values.len() * 4) as f64;
    let mut bases = args.bases.clone();
    if !bases.contains(&DEFAULT_BASE) {
        bases.push(DEFAULT_BASE);
    }
    bases.sort_by(f64::total_cmp);
    let gbs = |secs: f64| dense_bytes / secs / 1e9;

    println!(
        "{} values, {:?}, seed {}, median of {} reps; GB/s are of dense f32 input\n",
        values.len(),
        dist,
        args.seed,
        args.reps
    );
    println!("| density | base | kept | B/kept codec | B/kept raw | B/kept zstd-3 | q bits | key widths (flag bits) | enc top-k GB/s | enc thresh GB/s | dec GB/s | copy GB/s | max rel err | mean rel err |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut copy_dst = vec![0f32; values.len()];
    let mut dense_out = vec![0f32; values.len()];
    for &density in &args.density {
        let k = ((values.len() as f64) * density).round() as usize;
        let kept = codec::top_k(&values, k)?;
        // Threshold just below the k-th magnitude keeps the same set.
        let cut = kept
            .values()
            .iter()
            .map(|v| v.abs())
            .fold(f32::INFINITY, f32::min);
        let thr = f32::from_bits(cut.to_bits().saturating_sub(1));
        let mut raw = Vec::with_capacity(kept.len() * 8);
        for (&key, &v) in kept.keys().iter().zip(kept.values()) {
            raw.extend_from_slice(&key.to_le_bytes());
            raw.extend_from_slice(&v.to_le_bytes());
        }
        let zstd_len = zstd::bulk::compress(&raw, 3)?.len();
        for &base in &bases {
            let frame = codec::encode(&kept, base)?;
            let h = codec::parse_header(&frame)?.0;
            let copy = median_secs(args.reps, || copy_dst.copy_from_slice(&values));
            let enc_topk = median_secs(args.reps, || {
                let f = codec::encode_dense(&values, Selection::TopK(k), base);
                assert_eq!(f.as_ref().map(Vec::len).ok(), Some(frame.len()));
            });
            let enc_thr = median_secs(args.reps, || {
                let f = codec::encode_dense(&values, Selection::Threshold(thr), base);
                assert_eq!(f.as_ref().map(Vec::len).ok(), Some(frame.len()));
            });
            let dec = median_secs(args.reps, || {
                let r = codec::decode_into_dense(&frame, &mut dense_out);
                assert!(r.is_ok());
            });
            let back = codec::decode(&frame)?;
            let (mut max_e, mut sum_e) = (0f64, 0f64);
            for (&a, &b) in kept.values().iter().zip(back.values()) {
                let e = ((f64::from(b) - f64::from(a)) / f64::from(a)).abs();
                max_e = max_e.max(e);
                sum_e += e;
            }
            let n = kept.len().max(1) as f64;
            let tag = if base == DEFAULT_BASE {
                " (default)"
            } else {
                ""
            };
            println!(
                "| {:.2}% | {}{} | {} | {:.3} | 8 | {:.3} | {} | {:?} ({}) | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}% | {:.2}% |",
                density * 100.0,
                base,
                tag,
                kept.len(),
                frame.len() as f64 / n,
                zstd_len as f64 / n,
                h.q_width,
                h.scheme.widths(),
                h.scheme.flag_bits(),
                gbs(enc_topk),
                gbs(enc_thr),
                gbs(dec),
                gbs(copy),
                max_e * 100.0,
                sum_e / n * 100.0,
            );
        }
    }
    Ok(())
}
