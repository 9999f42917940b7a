//! Every committed seed and every fuzz finding kept as a regression, replayed through the same
//! `check` (and the same model) that the cargo-fuzz targets run, in plain `cargo test`.
//!
//! A finding goes to `regressions/<target>/` once its cause is fixed; seeds live in
//! `seeds/<target>/`. Every target must have seeds (the smoke runs in CI start from them).

use std::fs;
use std::path::{Path, PathBuf};

use rivet_fuzz::typed_input;

/// The inputs of one target in `dir` (`seeds` or `regressions`), sorted by name.
fn inputs(dir: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join(target);
    let Ok(entries) = fs::read_dir(&path) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.map(|e| e.expect("readable entry").path()).collect();
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let bytes = fs::read(&file).expect("readable input");
            (file, bytes)
        })
        .collect()
}

/// Runs `check` on every seed and regression of `target`; returns how many ran. A target
/// without seeds fails: CI's smoke run would start it from nothing.
fn replay(target: &str, check: impl Fn(&[u8])) -> usize {
    let seeds = inputs("seeds", target);
    assert!(!seeds.is_empty(), "fuzz/seeds/{target}/ has no seeds");
    let mut ran = 0;
    for (file, bytes) in seeds.iter().chain(&inputs("regressions", target)) {
        eprintln!("replaying {}", file.display());
        check(bytes);
        ran += 1;
    }
    ran
}

#[test]
fn collnet_decode() {
    replay("collnet_decode", rivet_fuzz::collnet_decode::check);
}

#[test]
fn data_decode() {
    replay("data_decode", rivet_fuzz::data_decode::check);
}

#[test]
fn handshake_decode() {
    replay("handshake_decode", rivet_fuzz::handshake_decode::check);
}

#[test]
fn handshake_hostile() {
    replay("handshake_hostile", rivet_fuzz::handshake_hostile::check);
}

#[test]
fn data_ops() {
    replay("data_ops", |bytes| {
        if let Some(input) = typed_input(bytes) {
            rivet_fuzz::data_ops::check(input);
        }
    });
}

#[test]
fn eager_ops() {
    replay("eager_ops", rivet_fuzz::eager_ops::check);
}

/// The committed seeds of `eager_ops` are its generator's scenarios, decode back to them, and
/// each run shows what its scenario is for (`RIVET_WRITE_SEEDS=1` rewrites them).
#[test]
fn eager_ops_seeds_are_generated() {
    use rivet_fuzz::eager_ops::{Input, run, seeds};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/eager_ops");
    let write = std::env::var_os("RIVET_WRITE_SEEDS").is_some_and(|v| v == "1");
    for seed in seeds::seeds() {
        let bytes = seed.input.encode();
        assert_eq!(
            Input::decode(&bytes),
            seed.input,
            "seed {} decodes otherwise",
            seed.name
        );
        let outcome = run(&seed.input);
        assert!(
            (seed.shows)(&outcome),
            "seed {} does not show what it is for: {outcome:?}",
            seed.name
        );
        let file = dir.join(seed.name);
        if write {
            fs::create_dir_all(&dir).expect("seed directory");
            fs::write(&file, &bytes).expect("seed written");
        }
        assert_eq!(
            fs::read(&file).ok(),
            Some(bytes),
            "{} is stale",
            file.display()
        );
    }
}

#[test]
fn multi_ops() {
    let ran = replay("multi_ops", |bytes| {
        if let Some(input) = typed_input(bytes) {
            rivet_fuzz::multi_ops::check(input);
        }
    });
    // The two findings of issue #31 are among them.
    assert!(ran >= 2);
}

#[test]
fn failover() {
    replay("failover", rivet_fuzz::failover::check);
}

/// The committed seeds of `failover` are its generator's scenarios, decode back to them, and
/// each run shows what its scenario is for (`RIVET_WRITE_SEEDS=1` rewrites them).
#[test]
fn failover_seeds_are_generated() {
    use rivet_fuzz::failover::{Input, run, seeds};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/failover");
    let write = std::env::var_os("RIVET_WRITE_SEEDS").is_some_and(|v| v == "1");
    for seed in seeds::seeds() {
        let bytes = seed.input.encode();
        assert_eq!(
            Input::decode(&bytes),
            seed.input,
            "seed {} decodes otherwise",
            seed.name
        );
        let outcome = run(&seed.input);
        assert!(
            (seed.shows)(&outcome),
            "seed {} does not show what it is for: {outcome:?}",
            seed.name
        );
        let file = dir.join(seed.name);
        if write {
            fs::create_dir_all(&dir).expect("seed directory");
            fs::write(&file, &bytes).expect("seed written");
        }
        assert_eq!(
            fs::read(&file).ok(),
            Some(bytes),
            "{} is stale",
            file.display()
        );
    }
}

#[test]
fn rma_ops() {
    replay("rma_ops", |bytes| {
        if let Some(input) = typed_input(bytes) {
            rivet_fuzz::rma_ops::check(input);
        }
    });
}

/// The committed seeds of `rma_ops` are its generator's scenarios, and decode back to them
/// (`RIVET_WRITE_SEEDS=1` rewrites them).
#[test]
fn rma_ops_seeds_are_generated() {
    use rivet_fuzz::rma_ops::{Input, seeds};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/rma_ops");
    let write = std::env::var_os("RIVET_WRITE_SEEDS").is_some_and(|v| v == "1");
    for (name, input) in seeds::seeds() {
        let bytes = seeds::encode(&input);
        assert_eq!(
            typed_input::<Input>(&bytes),
            Some(input),
            "seed {name} decodes otherwise"
        );
        let file = dir.join(name);
        if write {
            fs::create_dir_all(&dir).expect("seed directory");
            fs::write(&file, &bytes).expect("seed written");
        }
        assert_eq!(
            fs::read(&file).ok(),
            Some(bytes),
            "{} is stale",
            file.display()
        );
    }
}
