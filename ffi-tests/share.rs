//! Weight sharing across sessions (`ep.share_ep_contexts`), through ORT's C
//! API. A process of its own: the shared workspace is process-wide.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use kiln_ep::target::Target;

fn env() -> &'static Env {
    quiet_env()
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    serial_registered("kiln")
}

fn host() -> EpDevice {
    env()
        .kiln_devices()
        .into_iter()
        .find(|d| d.target() == Target::cpu_best().name())
        .unwrap()
}

fn options(share: bool) -> SessionOptions {
    let o = SessionOptions::new().with_devices(env(), &[&host()], &[]).unwrap();
    if share {
        o.config("ep.share_ep_contexts", "1")
    } else {
        o
    }
}

/// Copies the named models into a fresh folder.
fn workdir(models: &[&str]) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let paths = models
        .iter()
        .map(|m| {
            let p = dir.path().join(m);
            std::fs::copy(model(m), &p).unwrap();
            p
        })
        .collect();
    (dir, paths)
}

/// Compiles `models` as one sharing group (the last session stops it).
fn compile_group(models: &[PathBuf]) -> OrtResult<()> {
    for (i, m) in models.iter().enumerate() {
        let mut o = options(true)
            .config("ep.context_enable", "1")
            .config("ep.context_embed_mode", "0");
        if i + 1 == models.len() {
            o = o.config("ep.stop_share_ep_contexts", "1");
        }
        o.session(env(), m)?;
    }
    Ok(())
}

fn ctx_of(model: &Path) -> PathBuf {
    let stem = model.file_stem().unwrap().to_string_lossy();
    model.with_file_name(format!("{stem}_ctx.onnx"))
}

fn outputs_of(files: &[String], inputs: &[&str]) -> Vec<String> {
    files
        .iter()
        .filter(|f| !inputs.contains(&f.as_str()))
        .cloned()
        .collect()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn x() -> Tensor {
    Tensor::pattern(&[4, 64, 64], 11)
}

fn run(session: &Session) -> Tensor {
    session.run(&[("X", &x())], &["Y"]).unwrap().remove(0)
}

fn reference(model_name: &str) -> Tensor {
    run(&SessionOptions::new().session(env(), &model(model_name)).unwrap())
}

const WEIGHT: u64 = 64 * 64 * 4;

#[test]
fn n_models_give_n_plus_one_files_and_shared_weights_are_stored_once() {
    let _s = serial();
    let names = ["share_a.onnx", "share_b.onnx", "share_c.onnx"];
    let (dir, models) = workdir(&names);
    let before = kiln_stats();
    compile_group(&models).unwrap();
    let after = kiln_stats();
    assert_eq!(
        outputs_of(&files_in(dir.path()), &names),
        [
            "share_a_ctx.onnx",
            "share_a_kiln.bin",
            "share_b_ctx.onnx",
            "share_c_ctx.onnx"
        ]
    );
    // backbone W and B once, three heads: 5 weights stored of 9 referenced.
    let bin = std::fs::metadata(dir.path().join("share_a_kiln.bin")).unwrap().len();
    assert!(
        (5 * WEIGHT..5 * WEIGHT + 16 * 1024).contains(&bin),
        "binary is {bin} bytes"
    );
    assert_eq!(
        after.context_bytes_deduplicated - before.context_bytes_deduplicated,
        4 * WEIGHT
    );
    for (m, name) in models.iter().zip(names) {
        let session = options(false).session(env(), &ctx_of(m)).unwrap();
        assert_close(&run(&session), &reference(name));
    }
}

#[test]
fn sharing_sessions_open_the_binary_once_and_map_it_once() {
    let _s = serial();
    let names = ["share_a.onnx", "share_b.onnx"];
    let (dir, models) = workdir(&names);
    compile_group(&models).unwrap();
    let bin = dir.path().join("share_a_kiln.bin").canonicalize().unwrap();
    let mappings = || {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.ends_with(bin.to_str().unwrap()))
            .count()
    };
    let before = kiln_stats();
    let a = options(true).session(env(), &ctx_of(&models[0])).unwrap();
    let b = options(true).session(env(), &ctx_of(&models[1])).unwrap();
    let after = kiln_stats();
    assert_eq!(
        after.context_files_opened - before.context_files_opened,
        1,
        "opened once"
    );
    assert_eq!(
        after.context_files_shared - before.context_files_shared,
        1,
        "second session took it from the workspace"
    );
    assert_eq!(mappings(), 1, "one copy of the shared weights in memory");
    assert_close(&run(&a), &reference("share_a.onnx"));
    assert_close(&run(&b), &reference("share_b.onnx"));
    // Destroy in creation order (the design recommends reverse; any order must work).
    drop(a);
    assert_close(&run(&b), &reference("share_b.onnx"));
    drop(b);
    assert_eq!(mappings(), 0, "unmapped once no session uses it");

    // Without sharing, each session maps the file itself.
    let before = kiln_stats();
    let a = options(false).session(env(), &ctx_of(&models[0])).unwrap();
    let b = options(false).session(env(), &ctx_of(&models[1])).unwrap();
    assert_eq!(kiln_stats().context_files_opened - before.context_files_opened, 2);
    assert_eq!(mappings(), 2);
    drop((a, b));
}

#[test]
fn a_failing_session_does_not_spoil_its_group_and_groups_follow_each_other() {
    let _s = serial();
    let names = ["share_a.onnx", "share_b.onnx", "share_c.onnx"];
    let (dir, models) = workdir(&names);
    // a joins, b fails (embed mode 1 cannot share), c stops the group.
    let ok = |m: &Path, stop: bool| {
        let mut o = options(true)
            .config("ep.context_enable", "1")
            .config("ep.context_embed_mode", "0");
        if stop {
            o = o.config("ep.stop_share_ep_contexts", "1");
        }
        o.session(env(), m).map(drop)
    };
    ok(&models[0], false).unwrap();
    assert!(
        !dir.path().join("share_a_kiln.bin").exists(),
        "nothing is written before the stop session"
    );
    let err = options(true)
        .config("ep.context_enable", "1")
        .config("ep.context_embed_mode", "1")
        .session(env(), &models[1])
        .err()
        .unwrap();
    assert!(err.message.contains("ep.context_embed_mode=0"), "{}", err.message);
    ok(&models[2], true).unwrap();
    let files = outputs_of(&files_in(dir.path()), &names);
    assert!(
        files.contains(&"share_a_kiln.bin".to_string()) && !files.iter().any(|f| f.contains(".tmp")),
        "{files:?}"
    );
    for i in [0, 2] {
        let session = options(true).session(env(), &ctx_of(&models[i])).unwrap();
        assert_close(&run(&session), &reference(names[i]));
    }
    // A second group in the same process starts afresh, named after its first model.
    let (dir2, models2) = workdir(&["share_b.onnx", "share_c.onnx"]);
    compile_group(&models2).unwrap();
    assert!(dir2.path().join("share_b_kiln.bin").exists());
    let session = options(true).session(env(), &ctx_of(&models2[0])).unwrap();
    assert_close(&run(&session), &reference("share_b.onnx"));
}

#[test]
fn the_same_model_twice_in_a_group_needs_a_prefix() {
    let _s = serial();
    let (dir, models) = workdir(&["share_a.onnx"]);
    let copy = dir.path().join("copy").join("share_a.onnx");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    let out = dir.path().join("again_ctx.onnx");
    let start = options(true)
        .config("ep.context_enable", "1")
        .config("ep.context_embed_mode", "0");
    start.session(env(), &models[0]).unwrap();
    // Same model file again: the fused names repeat, so the graph names clash.
    let err = options(true)
        .config("ep.context_enable", "1")
        .config("ep.context_embed_mode", "0")
        .config("ep.context_file_path", out.to_str().unwrap())
        .session(env(), &models[0])
        .err()
        .unwrap();
    assert!(err.message.contains("ep.context_node_name_prefix"), "{}", err.message);
    // With a prefix it joins, and its stop writes the group's binary.
    options(true)
        .config("ep.context_enable", "1")
        .config("ep.context_embed_mode", "0")
        .config("ep.context_file_path", out.to_str().unwrap())
        .config("ep.context_node_name_prefix", "again_")
        .config("ep.stop_share_ep_contexts", "1")
        .session(env(), &models[0])
        .unwrap();
    let session = options(true).session(env(), &out).unwrap();
    assert_close(&run(&session), &reference("share_a.onnx"));
}

#[test]
fn sessions_created_and_destroyed_from_several_threads() {
    let _s = serial();
    let names = ["share_a.onnx", "share_b.onnx", "share_c.onnx"];
    let (_dir, models) = workdir(&names);
    compile_group(&models).unwrap();
    let want: Vec<Tensor> = names.iter().map(|n| reference(n)).collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (models, want) = (&models, &want);
            s.spawn(move || {
                for round in 0..6 {
                    let i = (t + round) % 3;
                    let session = options(true).session(env(), &ctx_of(&models[i])).unwrap();
                    assert_close(&run(&session), &want[i]);
                }
            });
        }
    });
}
