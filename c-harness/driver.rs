//! The C harness: C programs that use kiln the way a C application does,
//! built with the system C compiler and run by `cargo test --test c_harness`.
//!
//! - `run_model.c` links ONNX Runtime 1.31.1, registers kiln, picks kiln's
//!   host device, runs `add_mul_relu.onnx` (CPU fallback disabled) and
//!   `split.onnx` on it, compares every output with ORT's CPU EP in the same
//!   process, checks `kiln_ep_stats()` and a bad option's error, releases
//!   everything and unregisters kiln.
//! - `lifetime.c` calls `ReleaseEpFactory` before ORT loaded kiln, asks ORT
//!   for kiln's verdict on every hardware device, and keeps a session alive
//!   across `UnregisterExecutionProviderLibrary`, 20 times over.
//! - `bad_inputs.c` loads compiled models broken one way each (truncated,
//!   flipped, foreign, empty, directory, FIFO, symlinked-outside binaries, bad
//!   attributes and paths, wrong `source`, a re-typed output, tampered
//!   compatibility info, bad options) and checks each OrtErrorCode and message.
//! - `virtual_devices.c` registers kiln as `kiln.virtual`, checks the virtual
//!   devices, and runs or expects refusal on each; once more with the host
//!   capped by `KILN_MAX_TARGET=x86_64-generic`, so every virtual device is
//!   above the host.
//! - The public headers compile on their own, and together twice over, with
//!   `-Wall -Wextra -Wpedantic -Wstrict-prototypes -Werror` as C11, C17 and
//!   C99. C11 is the language they are written in (`_Static_assert`); C99
//!   passes only because glibc's <sys/cdefs.h>, pulled in by <stdint.h>,
//!   emulates `_Static_assert` before C11. The harness programs need C11
//!   (`_Generic`, `_Noreturn`).
//!
//! Programs are built with `$CC` (default `cc`) into
//! `target/tmp/c-harness/<profile>/` and linked against `libonnxruntime.so.1`,
//! a symlink there to the runtime the Rust tests use (`KILN_ORT_LIBRARY`,
//! else `.venv`): the wheel ships only `libonnxruntime.so.1.31.1`, whose
//! SONAME is `libonnxruntime.so.1`. kiln is `KILN_EP_LIBRARY`, else the
//! `libkiln_ep.so` cargo built for this test. Files are written under a
//! temporary name and renamed, so concurrent `cargo test` runs do not trip
//! over each other.

#[path = "../ffi-tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Flags for the harness programs: C11, every warning an error.
const CFLAGS: &[&str] = &[
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Wpedantic",
    "-Wstrict-prototypes",
    "-Werror",
    "-O0",
    "-g",
];

/// How long compiling or running one C program may take.
const TIMEOUT: Duration = Duration::from_secs(300);

fn compiler() -> String {
    std::env::var("CC")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| "cc".into())
}

fn harness_dir() -> PathBuf {
    common::repo().join("c-harness")
}

fn include_dir() -> PathBuf {
    common::repo().join("include")
}

/// `target/tmp/c-harness/<profile>`, created on first use.
fn out_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "default".into());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-harness").join(profile);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// A sibling of `path` private to this process, to rename over `path`.
fn private_twin(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap().to_string_lossy();
    path.with_file_name(format!(".{name}.{}", std::process::id()))
}

/// What a finished (or killed) command did.
struct Outcome {
    ok: bool,
    what: String,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to completion, capturing its output; kills it after `TIMEOUT`.
fn run(mut cmd: Command) -> Outcome {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {shown}: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break Some(status);
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (ok, what) = match status {
        Some(s) => (s.success(), format!("{shown} exited with {s}")),
        None => (false, format!("{shown} killed after {TIMEOUT:?}")),
    };
    Outcome {
        ok,
        what,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// A directory holding `libonnxruntime.so.1` -> the 1.31.1 runtime.
fn ort_link_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let ort = common::ort_library_path();
        let ort = ort.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", ort.display()));
        let dir = out_dir().join("ort");
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("libonnxruntime.so.1");
        let tmp = private_twin(&link);
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&ort, &tmp)
            .unwrap_or_else(|e| panic!("symlink {} -> {}: {e}", tmp.display(), ort.display()));
        std::fs::rename(&tmp, &link).unwrap_or_else(|e| panic!("rename to {}: {e}", link.display()));
        dir
    })
}

/// `-DKILN_STATS_SIZE_FROM_RUST=<size of the library's KilnStats>`: C code
/// that includes the harness header (or checks it) fails to compile when
/// `include/kiln_ep.h` declares a different KilnStats (a stale header).
fn stats_size_define() -> String {
    format!(
        "-DKILN_STATS_SIZE_FROM_RUST={}",
        std::mem::size_of::<kiln_ep::stats::KilnStats>()
    )
}

/// Compiles `c-harness/<name>.c` + `harness.c` into `<out dir>/<name>`.
fn build(name: &str) -> PathBuf {
    let src = harness_dir();
    let exe = out_dir().join(name);
    let tmp = private_twin(&exe);
    let ort_dir = ort_link_dir();
    let mut cmd = Command::new(compiler());
    cmd.args(CFLAGS)
        .arg(stats_size_define())
        .arg("-I")
        .arg(include_dir())
        .arg("-I")
        .arg(&src)
        .arg(src.join(format!("{name}.c")))
        .arg(src.join("harness.c"))
        .arg("-o")
        .arg(&tmp)
        .arg(format!("-L{}", ort_dir.display()))
        .arg("-l:libonnxruntime.so.1")
        .arg(format!("-Wl,-rpath,{}", ort_dir.display()))
        .args(["-ldl", "-lm"]);
    let outcome = run(cmd);
    assert!(outcome.ok, "compiling c-harness/{name}.c failed: {outcome}");
    std::fs::rename(&tmp, &exe).unwrap_or_else(|e| panic!("rename to {}: {e}", exe.display()));
    exe
}

/// `build(name)`, once per test binary.
fn built(name: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut done = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    done.entry(name.to_string()).or_insert_with(|| build(name)).clone()
}

/// kiln's library as an absolute path (what the programs dlopen and register).
fn kiln_library() -> PathBuf {
    let p = common::kiln_library_path();
    p.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Runs harness program `name` with `<kiln library> <models dir> <args>` and
/// extra environment; fails the test, showing its output, unless it exits 0.
fn run_program(name: &str, args: &[&str], env: &[(&str, &str)]) {
    let mut cmd = Command::new(built(name));
    cmd.arg(kiln_library())
        .arg(common::repo().join("models"))
        .args(args)
        .current_dir(common::repo());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let outcome = run(cmd);
    assert!(outcome.ok, "C harness program {name} failed: {outcome}");
    println!("{outcome}");
}

#[test]
fn c_program_runs_models_on_kiln() {
    run_program("run_model", &[], &[]);
}

#[test]
fn c_program_compiles_through_the_compile_api_then_loads() {
    let work = tempfile::tempdir().unwrap();
    run_program("compile_load", &[work.path().to_str().unwrap()], &[]);
}

#[test]
fn c_program_compiles_a_weight_sharing_group_then_shares_it() {
    let work = tempfile::tempdir().unwrap();
    run_program("share_compile", &[work.path().to_str().unwrap()], &[]);
}

/// The bad input table through the C API (bad_inputs.c): each broken
/// compiled model gives the expected OrtErrorCode and message, nothing hangs
/// (alarm() in the program, TIMEOUT here) and no file is left behind.
#[test]
fn c_program_bad_input_table() {
    let work = tempfile::tempdir().unwrap();
    run_program("bad_inputs", &[work.path().to_str().unwrap()], &[]);
}

#[test]
fn c_program_sessions_outlive_unregister() {
    run_program("lifetime", &[], &[]);
}

#[test]
fn c_program_sees_virtual_devices() {
    run_program("virtual_devices", &[], &[]);
}

/// With the host capped at x86_64-generic every virtual device is above the
/// host: sessions on them must fail with INVALID_ARGUMENT.
#[test]
fn c_program_virtual_devices_above_a_capped_host_are_refused() {
    run_program(
        "virtual_devices",
        &["--expect-host", "x86_64-generic"],
        &[("KILN_MAX_TARGET", "x86_64-generic")],
    );
}

/// `-fsyntax-only` over `source` (compiled as C) as `-std=<std>`.
fn syntax_check(source: &Path, std: &str) {
    let mut cmd = Command::new(compiler());
    cmd.arg(format!("-std={std}"))
        .args([
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Wstrict-prototypes",
            "-Werror",
            "-fsyntax-only",
        ])
        .arg("-I")
        .arg(include_dir())
        .arg(stats_size_define())
        .args(["-x", "c"])
        .arg(source);
    let outcome = run(cmd);
    assert!(outcome.ok, "{} does not compile as {std}: {outcome}", source.display());
}

/// Each public header compiles as the only include of a translation unit,
/// and both together twice over (include guards), as C11, C17 and C99.
#[test]
fn headers_compile_standalone() {
    let ep_h = include_dir().join("kiln_ep.h");
    assert!(
        ep_h.exists(),
        "{} missing: generate it with `make header` (KILN_BLESS=1 cargo test --test abi)",
        ep_h.display()
    );
    let both = out_dir().join("both_headers.c");
    let tmp = private_twin(&both);
    std::fs::write(
        &tmp,
        "#include \"kiln_ep.h\"\n#include \"kiln_ort_abi.h\"\n#include \"kiln_ep.h\"\n\
         #include \"kiln_ort_abi.h\"\n\
         _Static_assert(sizeof(KilnStats) == KILN_STATS_SIZE_FROM_RUST,\n\
         \x20              \"KilnStats in include/kiln_ep.h differs from the library's: make header\");\n\
         int main(void) {\n  KilnStats s;\n  return (int)kiln_ep_stats(&s, sizeof s);\n}\n",
    )
    .unwrap();
    std::fs::rename(&tmp, &both).unwrap();
    for std in ["c11", "c17", "c99"] {
        syntax_check(&include_dir().join("kiln_ort_abi.h"), std);
        syntax_check(&ep_h, std);
        syntax_check(&both, std);
    }
}
