//! kiln driven through ONNX Runtime 1.31.1's C API, as a C application would.
//! ORT's environment is a process singleton, so these tests share one and
//! run one at a time (`serial`).

mod common;

use std::sync::{Mutex, MutexGuard, OnceLock};

use common::*;
use kiln_ep::ffi::compute::{POOL_PROBES, REPROBE_COMPUTES};
use kiln_ep::ffi::sys;
use kiln_ep::target::Target;

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| Env::with_options(sys::ORT_LOGGING_LEVEL_INFO, &[]))
}

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers kiln under `name` for the guard's lifetime.
struct Registered(&'static str);

impl Registered {
    fn new(name: &'static str) -> Registered {
        env().register(name, &kiln_library_path()).expect("register kiln");
        Registered(name)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        env().unregister(self.0).expect("unregister kiln");
    }
}

fn host_device() -> EpDevice {
    let devices: Vec<_> = env().kiln_devices().into_iter().filter(|d| !d.is_virtual()).collect();
    assert_eq!(devices.len(), 1, "kiln offers exactly one host device: {devices:?}");
    devices[0].clone()
}

fn inputs_2x3x4() -> (Tensor, Tensor) {
    (Tensor::pattern(&[2, 3, 4], 1), Tensor::pattern(&[2, 3, 4], 2))
}

fn cpu_session(model: &str) -> Session {
    SessionOptions::new()
        .session(env(), &common::model(model))
        .expect("CPU EP session")
}

fn kiln_session(model: &str, device: &EpDevice, options: &[(&str, &str)]) -> OrtResult<Session> {
    SessionOptions::new()
        .with_devices(env(), &[device], options)?
        .session(env(), &common::model(model))
}

/// ORT 1.31.1 reports a CreateEp failure as ORT_FAIL "Error creating execution
/// provider: [ONNXRuntimeError] : <kiln's code> : <kiln's message>", so the
/// code kiln chose is checked inside the message.
fn assert_create_ep_error(err: &OrtError, kiln_code: &str, needles: &[&str]) {
    assert_eq!(err.code, sys::ORT_FAIL, "{}", err.message);
    assert!(err.message.contains(&format!(": {kiln_code} :")), "{}", err.message);
    for n in needles {
        assert!(err.message.contains(n), "{n:?} missing from {}", err.message);
    }
}

fn expected_host() -> Target {
    Target::cpu_best()
}

#[test]
fn runtime_is_1_31_1() {
    assert_eq!(ort().version, "1.31.1");
}

#[test]
fn register_list_unregister_cycles() {
    let _s = serial();
    for _ in 0..5 {
        assert!(env().kiln_devices().is_empty());
        let reg = Registered::new("kiln_cycle");
        assert_eq!(env().kiln_devices().len(), 1);
        drop(reg);
        assert!(env().kiln_devices().is_empty());
    }
}

#[test]
fn registering_one_name_twice_fails() {
    let _s = serial();
    let _reg = Registered::new("kiln_twice");
    let err = env().register("kiln_twice", &kiln_library_path()).unwrap_err();
    assert_eq!(err.code, sys::ORT_FAIL);
    assert!(err.message.contains("already registered"), "{}", err.message);
}

#[test]
fn host_device_metadata_and_options() {
    let _s = serial();
    let _reg = Registered::new("kiln_meta");
    let d = host_device();
    assert_eq!(d.ep_name, "KilnExecutionProvider");
    assert_eq!(d.ep_vendor, "kiln");
    assert_eq!(
        d.ep_metadata.get("version").map(String::as_str),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert!(d.ep_metadata.contains_key("library_path"));
    assert_eq!(d.target(), expected_host().name());
    assert_eq!(d.ep_metadata["kiln.target_features"], expected_host().description());
    assert_eq!(
        d.ep_options.get("target").map(String::as_str),
        Some(expected_host().name())
    );
    assert_eq!(d.ep_options.get("disabled_ops").map(String::as_str), Some(""));
    assert_eq!(d.hw_type, sys::OrtHardwareDeviceType_CPU);
    assert!(!d.is_virtual());
}

#[test]
fn no_virtual_devices_without_virtual_name() {
    let _s = serial();
    let _reg = Registered::new("kiln_plain");
    assert!(env().kiln_devices().iter().all(|d| !d.is_virtual()));
}

#[test]
fn virtual_devices_via_registration_name() {
    let _s = serial();
    let _reg = Registered::new("kiln_cross.virtual");
    let devices = env().kiln_devices();
    assert_eq!(devices.len(), 3, "{devices:?}");
    let virtuals: Vec<_> = devices.iter().filter(|d| d.is_virtual()).collect();
    let mut targets: Vec<_> = virtuals.iter().map(|d| d.target().to_string()).collect();
    targets.sort();
    let mut expected: Vec<_> = Target::ALL
        .iter()
        .filter(|t| **t != expected_host())
        .map(|t| t.name().to_string())
        .collect();
    expected.sort();
    assert_eq!(targets, expected);
    for d in &virtuals {
        assert_eq!(d.hw_metadata["kiln.target"], d.target());
        assert_eq!(d.hw_vendor, "kiln");
        assert_eq!(d.hw_vendor_id, kiln_ep::ep::VENDOR_ID);
        assert_eq!(d.ep_options["target"], d.target());
    }
}

#[test]
fn add_mul_relu_matches_cpu_ep_and_runs_on_kiln() {
    let _s = serial();
    let _reg = Registered::new("kiln_amr");
    let before = kiln_stats();
    let (a, b) = inputs_2x3x4();
    {
        // With CPU fallback disabled, the session only exists if kiln took every node.
        let session = SessionOptions::new()
            .config("session.disable_cpu_ep_fallback", "1")
            .with_devices(env(), &[&host_device()], &[])
            .unwrap()
            .session(env(), &model("add_mul_relu.onnx"))
            .expect("kiln session without CPU fallback");
        let got = session.run(&[("A", &a), ("B", &b)], &["Y"]).unwrap();
        let want = cpu_session("add_mul_relu.onnx")
            .run(&[("A", &a), ("B", &b)], &["Y"])
            .unwrap();
        assert_close(&got[0], &want[0]);
        assert!(got[0].data.iter().any(|&x| x > 0.0) && got[0].data.contains(&0.0));
    }
    let after = kiln_stats();
    assert_eq!(after.partitions_compiled - before.partitions_compiled, 1);
    assert_eq!(after.nodes_compiled - before.nodes_compiled, 3);
    assert_eq!(after.compute_calls - before.compute_calls, 1);
}

#[test]
fn unsupported_op_in_the_middle_splits_partitions() {
    let _s = serial();
    let _reg = Registered::new("kiln_split");
    let x = Tensor::pattern(&[2, 3, 4], 3);
    let before = kiln_stats();
    {
        let session = kiln_session("split.onnx", &host_device(), &[]).unwrap();
        let got = session.run(&[("X", &x)], &["Y", "Z"]).unwrap();
        let want = cpu_session("split.onnx").run(&[("X", &x)], &["Y", "Z"]).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_close(g, w);
        }
    }
    let after = kiln_stats();
    assert!(after.partitions_compiled - before.partitions_compiled >= 2);
    assert!(after.compute_calls - before.compute_calls >= 2);
    let err = SessionOptions::new()
        .config("session.disable_cpu_ep_fallback", "1")
        .with_devices(env(), &[&host_device()], &[])
        .unwrap()
        .session(env(), &model("split.onnx"))
        .err()
        .expect("the CPU EP must run Atan and Asinh");
    assert_eq!(err.code, sys::ORT_FAIL);
}

#[test]
fn model_kiln_cannot_claim_runs_on_cpu() {
    let _s = serial();
    let _reg = Registered::new("kiln_unsup");
    let x = Tensor::pattern(&[2, 3, 4], 4);
    let before = kiln_stats();
    {
        let session = kiln_session("unsupported.onnx", &host_device(), &[]).unwrap();
        let got = session.run(&[("X", &x)], &["Y", "Z"]).unwrap();
        let want = cpu_session("unsupported.onnx").run(&[("X", &x)], &["Y", "Z"]).unwrap();
        assert_eq!(got, want);
    }
    let after = kiln_stats();
    assert_eq!(after.partitions_compiled, before.partitions_compiled);
    assert_eq!(after.compute_calls, before.compute_calls);
}

#[test]
fn all_ops_with_broadcasting_match_cpu_ep() {
    let _s = serial();
    let _reg = Registered::new("kiln_allops");
    let (x, g, h) = (
        Tensor::pattern(&[2, 3, 4], 5),
        Tensor::pattern(&[3, 1], 6),
        Tensor::pattern(&[2, 1, 4], 7),
    );
    let feeds = [("X", &x), ("G", &g), ("H", &h)];
    let session = kiln_session("all_ops.onnx", &host_device(), &[]).unwrap();
    let got = session.run(&feeds, &["Y", "R", "GH"]).unwrap();
    let want = cpu_session("all_ops.onnx").run(&feeds, &["Y", "R", "GH"]).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_close(g, w);
    }
}

#[test]
fn disabled_ops_option_leaves_ops_to_cpu() {
    let _s = serial();
    let _reg = Registered::new("kiln_disabled");
    let (a, b) = inputs_2x3x4();
    let before = kiln_stats();
    {
        let session = kiln_session("add_mul_relu.onnx", &host_device(), &[("disabled_ops", "Mul")]).unwrap();
        let got = session.run(&[("A", &a), ("B", &b)], &["Y"]).unwrap();
        let want = cpu_session("add_mul_relu.onnx")
            .run(&[("A", &a), ("B", &b)], &["Y"])
            .unwrap();
        assert_close(&got[0], &want[0]);
    }
    let after = kiln_stats();
    assert_eq!(
        after.partitions_compiled - before.partitions_compiled,
        2,
        "Add and Relu, split by Mul"
    );
    assert_eq!(after.nodes_compiled - before.nodes_compiled, 2);
}

#[test]
fn bad_options_are_invalid_argument_naming_the_option() {
    let _s = serial();
    let _reg = Registered::new("kiln_badopt");
    let device = host_device();
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: [Case; 3] = [
        (&[("target", "riscv64")], &["'target'", "riscv64", "x86_64-generic"]),
        (
            &[("disabled_ops", "Relu,QLinearConv")],
            &["'disabled_ops'", "QLinearConv", "Sigmoid"],
        ),
        (
            &[("fast_math", "1")],
            &["unknown kiln option 'fast_math'", "target", "disabled_ops"],
        ),
    ];
    for (options, needles) in cases {
        let err = kiln_session("add_mul_relu.onnx", &device, options)
            .err()
            .expect("must fail");
        assert_create_ep_error(&err, "2 : INVALID_ARGUMENT", needles);
    }
}

#[test]
fn virtual_device_targets_run_here() {
    let _s = serial();
    let _reg = Registered::new("kiln_vrun.virtual");
    let (a, b) = inputs_2x3x4();
    let want = cpu_session("add_mul_relu.onnx")
        .run(&[("A", &a), ("B", &b)], &["Y"])
        .unwrap();
    for d in env().kiln_devices() {
        let target = Target::parse(d.target()).unwrap();
        let result = kiln_session("add_mul_relu.onnx", &d, &[]);
        if target.can_run_on(expected_host()) {
            let got = result.unwrap().run(&[("A", &a), ("B", &b)], &["Y"]).unwrap();
            assert_close(&got[0], &want[0]);
        } else {
            let err = result.err().expect("a target above the host only compiles");
            assert_create_ep_error(&err, "2 : INVALID_ARGUMENT", &["cannot run on this host"]);
        }
    }
}

#[test]
fn max_target_env_lowers_the_host_target() {
    let _s = serial();
    std::env::set_var(kiln_ep::target::MAX_TARGET_ENV, "x86_64-avx2");
    let reg = Registered::new("kiln_capped.virtual");
    std::env::remove_var(kiln_ep::target::MAX_TARGET_ENV);
    let capped = Target::Avx2.min(expected_host());
    assert_eq!(host_device().target(), capped.name());
    let avx512 = env()
        .kiln_devices()
        .into_iter()
        .find(|d| d.target() == "x86_64-avx512")
        .unwrap();
    assert!(avx512.is_virtual());
    let err = kiln_session("add_mul_relu.onnx", &avx512, &[]).err().unwrap();
    assert_create_ep_error(&err, "2 : INVALID_ARGUMENT", &["x86_64-avx512 cannot run on this host"]);

    // Cross-compiling for the AVX-512 virtual device still works ...
    let compile_opts = SessionOptions::new().with_devices(env(), &[&avx512], &[]).unwrap();
    let input = CompileInput::Path(&model("add_mul_relu.onnx"));
    let compiled = compile(env(), &compile_opts, input, CompileOutput::Buffer, true, 0)
        .unwrap()
        .unwrap();
    let host = host_device();
    let info = kiln_ep::context::compatibility_info(Target::Avx512);
    assert_eq!(
        model_compatibility(&[&host], &info).unwrap(),
        sys::OrtCompiledModelCompatibility_EP_UNSUPPORTED
    );
    // ... but this "host" refuses to load it: ORT on kiln's verdict,
    let err = kiln_session_from_bytes(&host, &compiled).err().unwrap();
    assert_eq!(err.code, sys::ORT_FAIL, "{}", err.message);
    assert!(err.message.contains("not supported"), "{}", err.message);
    // and kiln itself when the model carries no compatibility info.
    let key = b"ep_compatibility_info.KilnExecutionProvider";
    let stripped = replace_bytes(&compiled, key, b"xx_compatibility_info.KilnExecutionProvider");
    let err = kiln_session_from_bytes(&host, &stripped).err().unwrap();
    assert_eq!(err.code, sys::ORT_INVALID_GRAPH, "{}", err.message);
    assert!(err.message.contains("compiled for x86_64-avx512"), "{}", err.message);
    drop(reg);
}

fn kiln_session_from_bytes(device: &EpDevice, bytes: &[u8]) -> OrtResult<Session> {
    SessionOptions::new()
        .with_devices(env(), &[device], &[])?
        .session_from_bytes(env(), bytes)
}

/// Replaces every occurrence of `from` by the same-length `to`.
fn replace_bytes(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = data.to_vec();
    let mut found = 0;
    for i in 0..=out.len() - from.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            found += 1;
        }
    }
    assert!(found > 0, "pattern not found");
    out
}

#[test]
fn concurrent_runs_on_one_session() {
    let _s = serial();
    let _reg = Registered::new("kiln_threads");
    let (a, b) = inputs_2x3x4();
    let want = cpu_session("add_mul_relu.onnx")
        .run(&[("A", &a), ("B", &b)], &["Y"])
        .unwrap();
    {
        let session = SessionOptions::new()
            .threads(2)
            .with_devices(env(), &[&host_device()], &[])
            .unwrap()
            .session(env(), &model("add_mul_relu.onnx"))
            .unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..25 {
                        let got = session.run(&[("A", &a), ("B", &b)], &["Y"]).unwrap();
                        assert_close(&got[0], &want[0]);
                    }
                });
            }
        });
    }
}

/// Issue #10: 8 threads x 200 runs of the demo FFN block on one session, 16 inputs
/// spread so that threads run different inputs at once. Every result equals, bit for
/// bit, the same input run alone on the same session, which matches the CPU EP.
#[test]
fn eight_threads_of_200_runs_match_single_runs_bit_for_bit() {
    const THREADS: usize = 8;
    const RUNS: usize = 200;
    const FEEDS: usize = 16;
    let _s = serial();
    let _reg = Registered::new("kiln_threads_8x200");
    let feeds: Vec<Tensor> = (0..FEEDS as u32)
        .map(|seed| Tensor::pattern(&[1, 32, 128], seed + 1))
        .collect();
    let cpu = cpu_session("demo.onnx");
    let session = SessionOptions::new()
        .config("session.disable_cpu_ep_fallback", "1")
        .with_devices(env(), &[&host_device()], &[])
        .unwrap()
        .session(env(), &model("demo.onnx"))
        .unwrap();
    let single: Vec<Tensor> = feeds
        .iter()
        .map(|x| session.run(&[("x", x)], &["y"]).unwrap().remove(0))
        .collect();
    for (i, (x, got)) in feeds.iter().zip(&single).enumerate() {
        let want = cpu.run(&[("x", x)], &["y"]).unwrap().remove(0);
        let diff = max_abs_diff(got, &want);
        assert!(diff <= 1e-4, "input {i}: kiln differs from the CPU EP by {diff}");
    }
    let before = kiln_stats().compute_calls;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (session, feeds, single) = (&session, &feeds, &single);
            s.spawn(move || {
                for j in 0..RUNS {
                    let i = (5 * t + 3 * j) % FEEDS;
                    let got = session.run(&[("x", &feeds[i])], &["y"]).unwrap().remove(0);
                    let same = bit_equal(&got, &single[i]);
                    assert!(same, "thread {t} run {j}: input {i} differs from its single run");
                }
            });
        }
    });
    assert_eq!(kiln_stats().compute_calls - before, (THREADS * RUNS) as u64);
    drop(session);
}

fn bit_equal(a: &Tensor, b: &Tensor) -> bool {
    a.shape == b.shape && a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn kiln_logs_through_ort_logger() {
    let _s = serial();
    let _reg = Registered::new("kiln_log");
    drop(kiln_session("add_mul_relu.onnx", &host_device(), &[]).unwrap());
    let lines = log_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("[kiln] GetCapability: kiln claims 3 of 3 nodes in 1 partition(s)")),
        "no kiln line among {} captured ORT log lines",
        lines.len()
    );
    assert!(lines.iter().any(|l| l.contains("[kiln] compiled partition")));
}

#[test]
fn model_from_bytes_runs() {
    let _s = serial();
    let _reg = Registered::new("kiln_bytes");
    let bytes = std::fs::read(model("add_mul_relu.onnx")).unwrap();
    let (a, b) = inputs_2x3x4();
    let session = SessionOptions::new()
        .with_devices(env(), &[&host_device()], &[])
        .unwrap()
        .session_from_bytes(env(), &bytes)
        .unwrap();
    let got = session.run(&[("A", &a), ("B", &b)], &["Y"]).unwrap();
    let want = cpu_session("add_mul_relu.onnx")
        .run(&[("A", &a), ("B", &b)], &["Y"])
        .unwrap();
    assert_close(&got[0], &want[0]);
}

/// Sets `KILN_INJECT_PANIC` while kiln is registered (it is read then).
fn register_with_injected_panic(name: &'static str, point: &str) -> Registered {
    std::env::set_var(kiln_ep::ep::INJECT_PANIC_ENV, point);
    let reg = Registered::new(name);
    std::env::remove_var(kiln_ep::ep::INJECT_PANIC_ENV);
    reg
}

#[test]
fn panic_in_compute_is_an_error_and_disables_the_ep() {
    let _s = serial();
    let _reg = register_with_injected_panic("kiln_panic_compute", "compute");
    let (a, b) = inputs_2x3x4();
    let session = kiln_session("add_mul_relu.onnx", &host_device(), &[]).unwrap();
    let err = session.run(&[("A", &a), ("B", &b)], &["Y"]).unwrap_err();
    assert_eq!(err.code, sys::ORT_EP_FAIL, "{}", err.message);
    assert!(err.message.contains("kiln panicked in Compute"), "{}", err.message);
    let err = session.run(&[("A", &a), ("B", &b)], &["Y"]).unwrap_err();
    assert_eq!(err.code, sys::ORT_EP_FAIL);
    assert!(err.message.contains("disabled"), "{}", err.message);
}

#[test]
fn panic_in_compile_fails_session_creation_cleanly() {
    let _s = serial();
    let _reg = register_with_injected_panic("kiln_panic_compile", "compile");
    let err = kiln_session("add_mul_relu.onnx", &host_device(), &[])
        .err()
        .expect("compile panicked");
    assert_eq!(err.code, sys::ORT_EP_FAIL, "{}", err.message);
    assert!(err.message.contains("kiln panicked in Compile"), "{}", err.message);
}

/// `attrs.onnx` wholly on kiln (no CPU EP fallback), `threads` intra-op threads.
fn attrs_session(threads: i32) -> Session {
    SessionOptions::new()
        .threads(threads)
        .config("session.disable_cpu_ep_fallback", "1")
        .with_devices(env(), &[&host_device()], &[])
        .unwrap()
        .session(env(), &model("attrs.onnx"))
        .expect("kiln takes Constant, Mul, LeakyRelu, Softmax and Transpose")
}

/// With `intra_op_num_threads=1`, ORT runs every ParallelFor task on the
/// caller: kiln learns that from its first calls' rendezvous, then plans
/// its kernels for one thread and stops calling ParallelFor
/// (`ffi::compute::PoolProbe`) until it checks again, REPROBE_COMPUTES
/// Computes and REPROBE_MICROS later.
#[test]
fn one_thread_sessions_stop_calling_parallel_for() {
    let _s = serial();
    let _reg = Registered::new("kiln_one_thread");
    let x = Tensor::pattern(&[256, 512], 21);
    let session = attrs_session(1);
    let want = cpu_session("attrs.onnx").run(&[("X", &x)], &["Y"]).unwrap();
    let before = kiln_stats();
    let run = || assert_close(&session.run(&[("X", &x)], &["Y"]).unwrap()[0], &want[0]);
    // Runs until the rendezvous have taught one thread: a Run of several
    // ParallelFor calls learns in one, a Run of one call in POOL_PROBES.
    let rendezvous = || kiln_stats().pool_rendezvous - before.pool_rendezvous;
    for runs in 1.. {
        run();
        if rendezvous() >= u64::from(POOL_PROBES) {
            break;
        }
        assert!(runs < POOL_PROBES, "{} rendezvous in {runs} Runs", rendezvous());
    }
    let learnt = kiln_stats();
    assert!(
        learnt.parallel_for_calls > before.parallel_for_calls,
        "planned for the host's 2 CPUs first"
    );
    assert_eq!(learnt.pool_rendezvous - before.pool_rendezvous, u64::from(POOL_PROBES));
    assert_eq!(
        learnt.pool_rendezvous_joined, before.pool_rendezvous_joined,
        "no pool thread to join"
    );
    // The Runs after learning are planned for one thread until the check,
    // REPROBE_COMPUTES Computes on (or later: it also waits REPROBE_MICROS,
    // which a slow Run under valgrind passes).
    for _ in 0..REPROBE_COMPUTES - 1 {
        run();
    }
    let after = kiln_stats();
    assert_eq!(
        after.parallel_for_calls, learnt.parallel_for_calls,
        "kiln still cuts work for a pool of one thread"
    );
    assert_eq!(after.pool_rendezvous, learnt.pool_rendezvous, "checked again too soon");
}

/// With two threads, a pool thread joins one of the first rendezvous (or a
/// later check), and kiln keeps splitting work over the pool.
#[test]
fn two_thread_sessions_find_the_pool() {
    let _s = serial();
    let _reg = Registered::new("kiln_two_threads");
    let x = Tensor::pattern(&[256, 512], 21);
    let session = attrs_session(2);
    let want = cpu_session("attrs.onnx").run(&[("X", &x)], &["Y"]).unwrap();
    let before = kiln_stats();
    // A pool thread may miss the first rendezvous (asleep, or its core busy);
    // the checks every REPROBE_MICROS find it within a few.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while kiln_stats().pool_rendezvous_joined == before.pool_rendezvous_joined {
        assert!(
            std::time::Instant::now() < deadline,
            "no pool thread joined a rendezvous in 20 s"
        );
        assert_close(&session.run(&[("X", &x)], &["Y"]).unwrap()[0], &want[0]);
    }
    let found = kiln_stats();
    for _ in 0..2 * REPROBE_COMPUTES {
        assert_close(&session.run(&[("X", &x)], &["Y"]).unwrap()[0], &want[0]);
    }
    let after = kiln_stats();
    assert!(
        after.parallel_for_calls >= found.parallel_for_calls + u64::from(2 * REPROBE_COMPUTES),
        "every Run splits its work"
    );
    assert_eq!(
        after.pool_rendezvous, found.pool_rendezvous,
        "a found pool is not probed again"
    );
}

#[test]
fn attributes_of_every_kind_and_ort_thread_pool() {
    let _s = serial();
    let _reg = Registered::new("kiln_attrs");
    let x = Tensor::pattern(&[256, 512], 21);
    let before = kiln_stats();
    {
        let session = attrs_session(2);
        let got = session.run(&[("X", &x)], &["Y"]).unwrap();
        let want = cpu_session("attrs.onnx").run(&[("X", &x)], &["Y"]).unwrap();
        assert_close(&got[0], &want[0]);
    }
    let after = kiln_stats();
    assert!(
        after.parallel_for_calls > before.parallel_for_calls,
        "kiln split work over ORT's intra-op pool (KernelContext_ParallelFor)"
    );
}
