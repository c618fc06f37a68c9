//! EPContext through ORT's C API: both routes (session options and the
//! compile API), embed modes 0 and 1, loading, errors, compatibility and
//! cross-compiling. A process of its own (ORT's environment is a singleton).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use kiln_ep::ffi::sys;
use kiln_ep::target::Target;

fn env() -> &'static Env {
    quiet_env()
}

/// Tests share one registration of kiln (`kiln.virtual`) and run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    serial_registered("kiln.virtual")
}

fn device(target: &str) -> EpDevice {
    env()
        .kiln_devices()
        .into_iter()
        .find(|d| d.target() == target)
        .expect("kiln device for target")
}

fn host() -> EpDevice {
    device(Target::cpu_best().name())
}

/// A fresh folder holding a copy of `model`.
fn workdir(model: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(model);
    std::fs::copy(common::model(model), &path).unwrap();
    (dir, path)
}

fn kiln_options(dev: &EpDevice) -> SessionOptions {
    SessionOptions::new().with_devices(env(), &[dev], &[]).unwrap()
}

fn amr_feeds() -> (Tensor, Tensor) {
    (Tensor::pattern(&[2, 3, 4], 1), Tensor::pattern(&[2, 3, 4], 2))
}

fn run_amr(session: &Session) -> Tensor {
    let (a, b) = amr_feeds();
    session.run(&[("A", &a), ("B", &b)], &["Y"]).unwrap().remove(0)
}

fn reference_amr() -> Tensor {
    run_amr(
        &SessionOptions::new()
            .session(env(), &model("add_mul_relu.onnx"))
            .unwrap(),
    )
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Compiles through the session-option route.
fn compile_with_session(dev: &EpDevice, model: &Path, embed: &str, file_path: Option<&Path>) -> OrtResult<()> {
    let mut options = kiln_options(dev)
        .config("ep.context_enable", "1")
        .config("ep.context_embed_mode", embed);
    if let Some(p) = file_path {
        options = options.config("ep.context_file_path", p.to_str().unwrap());
    }
    options.session(env(), model).map(drop)
}

#[test]
fn session_route_embed_0_writes_model_and_one_binary_beside_it() {
    let _s = serial();
    let (dir, model) = workdir("add_mul_relu.onnx");
    compile_with_session(&host(), &model, "0", None).unwrap();
    assert_eq!(
        files_in(dir.path()),
        ["add_mul_relu.onnx", "add_mul_relu_ctx.onnx", "add_mul_relu_kiln.bin"]
    );
    let before = kiln_stats();
    let session = kiln_options(&host())
        .session(env(), &dir.path().join("add_mul_relu_ctx.onnx"))
        .unwrap();
    assert_close(&run_amr(&session), &reference_amr());
    let after = kiln_stats();
    assert_eq!(
        after.partitions_compiled, before.partitions_compiled,
        "loading must not compile"
    );
    assert_eq!(after.context_graphs_loaded - before.context_graphs_loaded, 1);
    assert_eq!(after.context_files_opened - before.context_files_opened, 1);
    let info = session.metadata("ep_compatibility_info.KilnExecutionProvider").unwrap();
    assert_eq!(info, kiln_ep::context::compatibility_info(Target::cpu_best()));
}

#[test]
fn session_route_embed_1_writes_only_the_model() {
    let _s = serial();
    let (dir, model) = workdir("add_mul_relu.onnx");
    let out = dir.path().join("sub/amr_ctx.onnx");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    compile_with_session(&host(), &model, "1", Some(&out)).unwrap();
    assert_eq!(files_in(&dir.path().join("sub")), ["amr_ctx.onnx"]);
    let session = kiln_options(&host()).session(env(), &out).unwrap();
    assert_close(&run_amr(&session), &reference_amr());
}

#[test]
fn multi_partition_model_gets_one_binary_and_loads_each_graph_once() {
    let _s = serial();
    let (dir, model) = workdir("split.onnx");
    compile_with_session(&host(), &model, "0", None).unwrap();
    assert_eq!(files_in(dir.path()), ["split.onnx", "split_ctx.onnx", "split_kiln.bin"]);
    let x = Tensor::pattern(&[2, 3, 4], 9);
    let want = SessionOptions::new()
        .session(env(), &model)
        .unwrap()
        .run(&[("X", &x)], &["Y", "Z"])
        .unwrap();
    let before = kiln_stats();
    let session = kiln_options(&host())
        .session(env(), &dir.path().join("split_ctx.onnx"))
        .unwrap();
    let got = session.run(&[("X", &x)], &["Y", "Z"]).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_close(g, w);
    }
    let after = kiln_stats();
    assert!(after.context_graphs_loaded - before.context_graphs_loaded >= 2);
    assert_eq!(
        after.context_files_opened - before.context_files_opened,
        1,
        "one binary, read once"
    );
    assert_eq!(after.partitions_compiled, before.partitions_compiled);
}

#[test]
fn compile_api_path_buffer_and_stream_outputs() {
    let _s = serial();
    let (dir, model) = workdir("add_mul_relu.onnx");
    let opts = kiln_options(&host());
    let out = dir.path().join("compiled.onnx");
    // path -> path, embed 0: model + <model>_kiln.bin beside the output.
    compile(
        env(),
        &opts,
        CompileInput::Path(&model),
        CompileOutput::Path(&out),
        false,
        0,
    )
    .unwrap();
    assert!(dir.path().join("add_mul_relu_kiln.bin").exists());
    let session = kiln_options(&host()).session(env(), &out).unwrap();
    assert_close(&run_amr(&session), &reference_amr());
    // path -> buffer and stream, embed 1: self-contained bytes.
    for output in [CompileOutput::Buffer, CompileOutput::Stream] {
        let bytes = compile(env(), &opts, CompileInput::Path(&model), output, true, 0)
            .unwrap()
            .unwrap();
        let session = kiln_options(&host()).session_from_bytes(env(), &bytes).unwrap();
        assert_close(&run_amr(&session), &reference_amr());
    }
    // bytes -> path, embed 0: the binary goes beside the output path.
    let input = std::fs::read(&model).unwrap();
    let out2 = dir.path().join("from_bytes/m_ctx.onnx");
    std::fs::create_dir_all(out2.parent().unwrap()).unwrap();
    compile(
        env(),
        &opts,
        CompileInput::Bytes(&input),
        CompileOutput::Path(&out2),
        false,
        0,
    )
    .unwrap();
    assert_eq!(files_in(out2.parent().unwrap()), ["m_ctx.onnx", "m_kiln.bin"]);
    let session = kiln_options(&host()).session(env(), &out2).unwrap();
    assert_close(&run_amr(&session), &reference_amr());
}

#[test]
fn bytes_input_with_embed_0_and_no_output_path_is_invalid_argument() {
    let _s = serial();
    let input = std::fs::read(model("add_mul_relu.onnx")).unwrap();
    let err = compile(
        env(),
        &kiln_options(&host()),
        CompileInput::Bytes(&input),
        CompileOutput::Buffer,
        false,
        0,
    )
    .unwrap_err();
    assert_eq!(err.code, sys::ORT_INVALID_ARGUMENT, "{}", err.message);
    assert!(err.message.contains("ep.context_file_path"), "{}", err.message);
}

#[test]
fn compile_flags_are_honoured() {
    let _s = serial();
    let (dir, model) = workdir("unsupported.onnx");
    let out = dir.path().join("u_ctx.onnx");
    let err = compile(
        env(),
        &kiln_options(&host()),
        CompileInput::Path(&model),
        CompileOutput::Path(&out),
        true,
        1,
    )
    .unwrap_err();
    assert!(err.message.contains("Unable to compile any nodes"), "{}", err.message);
    let (dir, model) = workdir("add_mul_relu.onnx");
    let out = dir.path().join("a_ctx.onnx");
    std::fs::write(&out, b"existing").unwrap();
    let err = compile(
        env(),
        &kiln_options(&host()),
        CompileInput::Path(&model),
        CompileOutput::Path(&out),
        true,
        2,
    )
    .unwrap_err();
    assert!(err.message.contains("exist"), "{}", err.message);
    assert_eq!(std::fs::read(&out).unwrap(), b"existing");
}

/// Compiles add_mul_relu with embed 0 into `dir` and returns the ctx model path.
fn compiled_amr(dir: &Path) -> PathBuf {
    let model = dir.join("add_mul_relu.onnx");
    std::fs::copy(common::model("add_mul_relu.onnx"), &model).unwrap();
    compile_with_session(&host(), &model, "0", None).unwrap();
    dir.join("add_mul_relu_ctx.onnx")
}

fn load_error(ctx: &Path) -> OrtError {
    kiln_options(&host())
        .session(env(), ctx)
        .err()
        .expect("loading must fail")
}

#[test]
fn damaged_binaries_are_invalid_graph_naming_node_file_and_cause() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let ctx = compiled_amr(dir.path());
    let bin = dir.path().join("add_mul_relu_kiln.bin");
    let good = std::fs::read(&bin).unwrap();
    let mut cases: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("does not exist", None),
        ("truncated", Some(good[..good.len() / 2].to_vec())),
        (
            "not a kiln context binary",
            Some(b"PK\x03\x04 definitely not kiln".repeat(4)),
        ),
    ];
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x5a;
    cases.push(("checksum", Some(flipped)));
    let mut newer = good.clone();
    newer[8..12].copy_from_slice(&99u32.to_le_bytes());
    cases.push(("version", Some(newer)));
    for (cause, content) in cases {
        match &content {
            Some(bytes) => std::fs::write(&bin, bytes).unwrap(),
            None => std::fs::remove_file(&bin).unwrap(),
        }
        let err = load_error(&ctx);
        assert_eq!(err.code, sys::ORT_INVALID_GRAPH, "{cause}: {}", err.message);
        for needle in [cause, "add_mul_relu_kiln.bin", "EPContext node"] {
            assert!(err.message.contains(needle), "{needle:?} missing: {}", err.message);
        }
    }
    std::fs::write(&bin, &good).unwrap();
    assert_close(
        &run_amr(&kiln_options(&host()).session(env(), &ctx).unwrap()),
        &reference_amr(),
    );
}

#[test]
fn recompiling_a_compiled_model_is_refused() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let ctx = compiled_amr(dir.path());
    let out = dir.path().join("again_ctx.onnx");
    let err = compile_with_session(&host(), &ctx, "0", Some(&out)).unwrap_err();
    assert!(
        err.message.contains("already holds kiln EPContext node"),
        "{}",
        err.message
    );
    assert!(!out.exists());
}

#[test]
fn compatibility_answers_per_device() {
    let _s = serial();
    let info = |t: Target| kiln_ep::context::compatibility_info(t);
    let verdict = |dev: &EpDevice, info: &str| model_compatibility(&[dev], info).unwrap();
    let host_target = Target::cpu_best();
    assert_eq!(
        verdict(&host(), &info(host_target)),
        sys::OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL
    );
    assert_eq!(
        verdict(&host(), "someone-else;v=1"),
        sys::OrtCompiledModelCompatibility_EP_UNSUPPORTED
    );
    assert_eq!(
        verdict(
            &host(),
            &info(host_target).replace(&format!("format={}", kiln_ep::context::FORMAT_VERSION), "format=99")
        ),
        sys::OrtCompiledModelCompatibility_EP_UNSUPPORTED
    );
    if host_target == Target::Avx512 {
        assert_eq!(
            verdict(&host(), &info(Target::Avx2)),
            sys::OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION
        );
        let avx2 = device("x86_64-avx2");
        assert_eq!(
            verdict(&avx2, &info(Target::Avx512)),
            sys::OrtCompiledModelCompatibility_EP_UNSUPPORTED
        );
        assert_eq!(
            verdict(&avx2, &info(Target::Avx2)),
            sys::OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL
        );
    }
}

#[test]
fn cross_compiled_models_load_here_and_are_suboptimal() {
    let _s = serial();
    if Target::cpu_best() != Target::Avx512 {
        eprintln!("skipped: needs an AVX-512 host");
        return;
    }
    for target in ["x86_64-avx2", "x86_64-generic"] {
        let (dir, model) = workdir("add_mul_relu.onnx");
        compile_with_session(&device(target), &model, "0", None).unwrap();
        let ctx = dir.path().join("add_mul_relu_ctx.onnx");
        let session = kiln_options(&host()).session(env(), &ctx).unwrap();
        assert_close(&run_amr(&session), &reference_amr());
        let info = session.metadata("ep_compatibility_info.KilnExecutionProvider").unwrap();
        assert!(info.contains(target), "{info}");
        assert_eq!(
            model_compatibility(&[&host()], &info).unwrap(),
            sys::OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION
        );
        let err = kiln_options(&host())
            .config("session.fail_on_suboptimal_compiled_model", "1")
            .session(env(), &ctx)
            .err()
            .expect("suboptimal model refused on request");
        assert_eq!(err.code, sys::ORT_FAIL, "{}", err.message);
    }
}

fn mapped(path: &Path) -> bool {
    let real = path.canonicalize().unwrap();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .contains(real.to_str().unwrap())
}

#[test]
fn embed_0_binary_is_memory_mapped_while_the_session_lives() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let ctx = compiled_amr(dir.path());
    let bin = dir.path().join("add_mul_relu_kiln.bin");
    assert!(!mapped(&bin));
    let session = kiln_options(&host()).session(env(), &ctx).unwrap();
    assert!(
        mapped(&bin),
        "kiln uses the weights in place from a mapping of the binary"
    );
    assert_close(&run_amr(&session), &reference_amr());
    drop(session);
    assert!(!mapped(&bin), "the mapping goes with the session");
}

#[test]
fn model_from_bytes_loads_its_binary_relative_to_context_file_path() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let ctx = compiled_amr(dir.path());
    let bytes = std::fs::read(&ctx).unwrap();
    let err = kiln_options(&host()).session_from_bytes(env(), &bytes).err().unwrap();
    assert_eq!(err.code, sys::ORT_INVALID_GRAPH, "{}", err.message);
    assert!(err.message.contains("ep.context_file_path"), "{}", err.message);
    let session = kiln_options(&host())
        .config("ep.context_file_path", ctx.to_str().unwrap())
        .session_from_bytes(env(), &bytes)
        .unwrap();
    assert_close(&run_amr(&session), &reference_amr());
}

// --------------------------------------------------------------------------
// kiln_ep_inspect_context and kiln_ep_check_options (the tools' exports)
// --------------------------------------------------------------------------

type InspectFn = unsafe extern "C" fn(*const std::ffi::c_char, *const u8, usize, *mut std::ffi::c_char, usize) -> usize;
type CheckFn = unsafe extern "C" fn(
    *const *const std::ffi::c_char,
    *const *const std::ffi::c_char,
    usize,
    *mut std::ffi::c_char,
    usize,
) -> i32;

fn kiln_lib() -> &'static libloading::Library {
    static LIB: std::sync::OnceLock<libloading::Library> = std::sync::OnceLock::new();
    // SAFETY: kiln's own cdylib; loading it runs no initialisers with preconditions.
    LIB.get_or_init(|| unsafe { libloading::Library::new(kiln_library_path()) }.expect("load kiln"))
}

/// The JSON kiln_ep_inspect_context writes for a path or for bytes, read
/// with a buffer too small first (the snprintf contract) and then one that fits.
fn inspect(path: Option<&Path>, data: Option<&[u8]>) -> String {
    // SAFETY: the export's signature (include/kiln_ep.h).
    let f: libloading::Symbol<InspectFn> = unsafe { kiln_lib().get(b"kiln_ep_inspect_context") }.unwrap();
    let c_path = path.map(|p| cstring(p.to_str().unwrap()));
    let p = c_path.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    let (d, n) = data.map_or((std::ptr::null(), 0), |d| (d.as_ptr(), d.len()));
    let mut small = [0x7f as std::ffi::c_char; 8];
    // SAFETY: valid pointers and sizes.
    let len = unsafe { f(p, d, n, small.as_mut_ptr(), small.len()) };
    assert!(len > small.len(), "a JSON object is longer than 8 bytes");
    assert_eq!(small[7], 0, "truncated output is NUL-terminated");
    let mut buf = vec![0 as std::ffi::c_char; len + 1];
    // SAFETY: as above.
    assert_eq!(unsafe { f(p, d, n, buf.as_mut_ptr(), buf.len()) }, len);
    // SAFETY: NUL-terminated by the export.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn inspect_export_describes_valid_damaged_and_missing_binaries() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    compiled_amr(dir.path());
    let bin = dir.path().join("add_mul_relu_kiln.bin");
    let good = std::fs::read(&bin).unwrap();
    let host = Target::detect_host().unwrap().name();
    for json in [inspect(Some(&bin), None), inspect(None, Some(&good))] {
        for needle in [
            "\"valid\":true".to_string(),
            "\"error\":null".to_string(),
            "\"checksum_ok\":true".to_string(),
            format!("\"file_bytes\":{}", good.len()),
            format!("\"format_version\":{}", kiln_ep::context::FORMAT_VERSION),
            format!("\"target\":\"{}\"", Target::cpu_best().name()),
            "\"kind\":\"program\"".to_string(),
            "\"context_models\":[\"add_mul_relu_ctx.onnx\"]".to_string(),
            format!("\"host_target\":\"{host}\""),
            "\"host_verdict\":\"optimal\"".to_string(),
        ] {
            assert!(json.contains(&needle), "{needle} missing: {json}");
        }
    }
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x5a;
    let json = inspect(None, Some(&flipped));
    for needle in [
        "\"valid\":false",
        "\"checksum_ok\":false",
        "checksum mismatch",
        "\"host_verdict\":\"unsupported\"",
    ] {
        assert!(json.contains(needle), "{needle} missing: {json}");
    }
    let json = inspect(None, Some(&good[..good.len() / 2]));
    assert!(
        json.contains("\"checksum_ok\":null") && json.contains("truncated"),
        "{json}"
    );
    let json = inspect(Some(&dir.path().join("missing.bin")), None);
    assert!(
        json.contains("\"valid\":false") && json.contains("missing.bin"),
        "{json}"
    );
    let json = inspect(None, None);
    assert!(json.contains("both path and data are NULL"), "{json}");
}

/// (return code, message) of kiln_ep_check_options for these pairs.
fn check_options(pairs: &[(&str, &str)]) -> (i32, String) {
    // SAFETY: the export's signature (include/kiln_ep.h).
    let f: libloading::Symbol<CheckFn> = unsafe { kiln_lib().get(b"kiln_ep_check_options") }.unwrap();
    let keys: Vec<_> = pairs.iter().map(|(k, _)| cstring(k)).collect();
    let values: Vec<_> = pairs.iter().map(|(_, v)| cstring(v)).collect();
    let kp: Vec<_> = keys.iter().map(|c| c.as_ptr()).collect();
    let vp: Vec<_> = values.iter().map(|c| c.as_ptr()).collect();
    let mut msg = vec![0 as std::ffi::c_char; 4096];
    // SAFETY: `pairs.len()` strings each, a writable message buffer.
    let code = unsafe { f(kp.as_ptr(), vp.as_ptr(), pairs.len(), msg.as_mut_ptr(), msg.len()) };
    // SAFETY: NUL-terminated by the export.
    let text = unsafe { std::ffi::CStr::from_ptr(msg.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    (code, text)
}

#[test]
fn check_options_export_gives_create_eps_verdict() {
    assert_eq!(check_options(&[]), (0, String::new()));
    assert_eq!(
        check_options(&[
            ("target", "x86_64-generic"),
            ("disabled_ops", "Tanh,relu"),
            ("shape_cache", "4")
        ]),
        (0, String::new())
    );
    assert_eq!(check_options(&[("ep.kilnexecutionprovider.claim", "all")]).0, 0);
    let (code, msg) = check_options(&[("target", "arm64")]);
    assert_eq!(code, 1);
    assert!(msg.contains("invalid value 'arm64' for kiln option 'target'"), "{msg}");
    let (code, msg) = check_options(&[("no_such", "1")]);
    assert_eq!(code, 1);
    assert!(
        msg.contains("unknown kiln option 'no_such'") && msg.contains("shape_cache"),
        "{msg}"
    );
    // SAFETY: the export's signature (include/kiln_ep.h).
    let f: libloading::Symbol<CheckFn> = unsafe { kiln_lib().get(b"kiln_ep_check_options") }.unwrap();
    assert_eq!(
        // SAFETY: NULL arrays with a non-zero count are refused, never dereferenced.
        unsafe { f(std::ptr::null(), std::ptr::null(), 2, std::ptr::null_mut(), 0) },
        -1
    );
}
