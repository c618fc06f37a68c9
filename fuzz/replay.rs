//! Replays every fuzz input kept in the repository — the seed corpus
//! (`fuzz/corpus/<target>/`) and every crash ever found
//! (`fuzz/regressions/<target>/`) — through the same target bodies libFuzzer
//! runs (`kiln_ep::fuzzing`), without libFuzzer or a nightly toolchain. A
//! target fails by panicking (its own assertions check that every refusal is
//! a clean `Error`), so each file must return normally.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

type Target = fn(&[u8]) -> bool;

const TARGETS: [(&str, Target); 3] = [
    ("context_binary", kiln_ep::fuzzing::context_binary),
    ("ep_context_attrs", kiln_ep::fuzzing::ep_context_attrs),
    ("node_import", kiln_ep::fuzzing::node_import),
];

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .map(|e| e.expect("readable folder entry").path())
        .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    out.sort();
    out
}

/// What replaying one folder gave.
struct Replay {
    files: usize,
    /// Inputs the target accepted all the way (parsed, imported, ...).
    accepted: usize,
    failed: Vec<String>,
}

/// Runs `target` over every file in `dir`.
fn replay(target: Target, dir: &Path) -> Replay {
    let inputs = files(dir);
    let mut failed = Vec::new();
    let mut accepted = 0;
    for path in &inputs {
        let data = std::fs::read(path).expect("read a fuzz input");
        match catch_unwind(AssertUnwindSafe(|| target(&data))) {
            Ok(ok) => accepted += ok as usize,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failed.push(format!("{}: {why}", path.display()));
            }
        }
    }
    Replay {
        files: inputs.len(),
        accepted,
        failed,
    }
}

fn fuzz_dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(kind)
        .join(target)
}

/// Replays corpus and regressions of target `name`: nothing may panic, and
/// at least `min_accepted` (a fraction) of the seeds must be accepted all the
/// way, so the seeds really reach the code behind the first checks.
fn check_target(name: &str, target: Target, min_accepted: f64) {
    let seeds = replay(target, &fuzz_dir("corpus", name));
    let regressions = replay(target, &fuzz_dir("regressions", name));
    let failed: Vec<String> = seeds.failed.iter().chain(&regressions.failed).cloned().collect();
    // The seed corpus is committed; an empty one means the replay tests nothing.
    assert!(
        seeds.files >= 10,
        "fuzz/corpus/{name} has only {} files; run fuzz/make_corpus.py",
        seeds.files
    );
    assert!(
        failed.is_empty(),
        "{name}: {} of {} inputs panic:\n{}",
        failed.len(),
        seeds.files + regressions.files,
        failed.join("\n")
    );
    let share = seeds.accepted as f64 / seeds.files as f64;
    assert!(
        share >= min_accepted,
        "{name}: only {} of {} seeds accepted",
        seeds.accepted,
        seeds.files
    );
    eprintln!(
        "{name}: {} corpus inputs ({} accepted) + {} regression inputs replayed",
        seeds.files, seeds.accepted, regressions.files
    );
}

#[test]
fn context_binary_corpus_and_regressions() {
    check_target(TARGETS[0].0, TARGETS[0].1, 0.99);
}

#[test]
fn ep_context_attrs_corpus_and_regressions() {
    check_target(TARGETS[1].0, TARGETS[1].1, 0.9);
}

#[test]
fn node_import_corpus_and_regressions() {
    check_target(TARGETS[2].0, TARGETS[2].1, 0.5);
}

/// The replay must notice a target that panics (a test that cannot fail is a defect).
#[test]
fn replay_reports_a_panicking_target() {
    fn boom(data: &[u8]) -> bool {
        assert!(data.is_empty(), "boom");
        true
    }
    let r = replay(boom, &fuzz_dir("corpus", "context_binary"));
    assert!(
        r.files > 0 && r.failed.len() == r.files && r.accepted == 0,
        "{:?}",
        r.failed
    );
}
