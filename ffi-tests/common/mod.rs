//! A small ORT host for tests: loads `libonnxruntime.so.1.31.1` with
//! libloading and drives it through kiln's own ABI declarations, the way a
//! C application would.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kiln_ep::ffi::sys;

/// An error status from ORT, copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrtError {
    pub code: sys::OrtErrorCode,
    pub message: String,
}

pub type OrtResult<T> = Result<T, OrtError>;

pub struct Ort {
    _lib: libloading::Library,
    pub api: &'static sys::OrtApi,
    pub version: String,
}

// SAFETY: the API table is immutable and the library stays loaded.
unsafe impl Sync for Ort {}
unsafe impl Send for Ort {}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `libonnxruntime.so.1.31.1`: `KILN_ORT_LIBRARY`, else inside `.venv`.
pub fn ort_library_path() -> PathBuf {
    if let Some(p) = std::env::var_os("KILN_ORT_LIBRARY") {
        return PathBuf::from(p);
    }
    let lib = repo().join(".venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|dirs| {
        dirs.flatten()
            .map(|d| d.path().join("site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "libonnxruntime.so.1.31.1 not found under {}; run `make venv` or set KILN_ORT_LIBRARY",
            lib.display()
        )
    })
}

/// kiln's cdylib from the same build as this test binary, or `KILN_EP_LIBRARY`.
/// `cargo test` leaves a fresh cdylib in `target/<profile>/deps/` (it only
/// copies it up to `target/<profile>/` on `cargo build`).
pub fn kiln_library_path() -> PathBuf {
    if let Some(p) = std::env::var_os("KILN_EP_LIBRARY") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let candidates = [deps.join("libkiln_ep.so"), deps.parent().unwrap().join("libkiln_ep.so")];
    candidates.into_iter().find(|p| p.exists()).unwrap_or_else(|| {
        panic!(
            "libkiln_ep.so not found next to {}: build the crate first",
            exe.display()
        )
    })
}

pub fn model(name: &str) -> PathBuf {
    let p = repo().join("models").join(name);
    assert!(
        p.exists(),
        "model {} missing (python models/make_models.py)",
        p.display()
    );
    p
}

pub fn ort() -> &'static Ort {
    static ORT: OnceLock<Ort> = OnceLock::new();
    ORT.get_or_init(|| {
        let path = ort_library_path();
        // SAFETY: loading ONNX Runtime runs its initialisers, which is what we want.
        let lib = unsafe { libloading::Library::new(&path) }.unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
        // SAFETY: the symbol has this signature (facts sheet §2).
        let api = unsafe {
            let get_base: libloading::Symbol<unsafe extern "C" fn() -> *const sys::OrtApiBase> =
                lib.get(b"OrtGetApiBase").expect("OrtGetApiBase");
            let base = &*get_base();
            let version = CStr::from_ptr((base.GetVersionString.unwrap())())
                .to_string_lossy()
                .into_owned();
            let api = &*(base.GetApi.unwrap())(sys::ORT_API_VERSION);
            (api, version)
        };
        Ort {
            _lib: lib,
            api: api.0,
            version: api.1,
        }
    })
}

macro_rules! call {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        (crate::common::ort().api.$name.expect(stringify!($name)))($($arg),*)
    };
}

/// Converts an ORT status into a Result, releasing it.
pub fn check(status: *mut sys::OrtStatus) -> OrtResult<()> {
    if status.is_null() {
        return Ok(());
    }
    // SAFETY: a status ORT returned to us.
    unsafe {
        let err = OrtError {
            code: call!(GetErrorCode(status)),
            message: CStr::from_ptr(call!(GetErrorMessage(status)))
                .to_string_lossy()
                .into_owned(),
        };
        call!(ReleaseStatus(status));
        Err(err)
    }
}

pub fn cstring(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// # Safety
/// `p` must be NULL or a valid C string.
pub unsafe fn string(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// # Safety
/// `kv` must be NULL or a live OrtKeyValuePairs.
pub unsafe fn kv_map(kv: *const sys::OrtKeyValuePairs) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if kv.is_null() {
        return out;
    }
    let (mut keys, mut values, mut n) = (std::ptr::null(), std::ptr::null(), 0usize);
    unsafe {
        call!(GetKeyValuePairs(kv, &mut keys, &mut values, &mut n));
        for i in 0..n {
            out.insert(string(*keys.add(i)), string(*values.add(i)));
        }
    }
    out
}

/// Log lines ORT delivered to the custom logging function.
pub static LOG: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

unsafe extern "C" fn capture_log(
    _param: *mut std::ffi::c_void,
    _severity: sys::OrtLoggingLevel,
    _category: *const c_char,
    _logid: *const c_char,
    _code_location: *const c_char,
    message: *const c_char,
) {
    // SAFETY: ORT passes a valid message string.
    let msg = unsafe { string(message) };
    LOG.lock().unwrap().push(msg);
}

pub fn log_lines() -> Vec<String> {
    LOG.lock().unwrap().clone()
}

/// ORT's environment (a process-wide singleton in ORT).
pub struct Env(pub *mut sys::OrtEnv);
unsafe impl Sync for Env {}
unsafe impl Send for Env {}

impl Env {
    /// Creates the environment with `CreateEnvWithOptions`, capturing ORT's
    /// log (at `level`) and passing `config` entries to EP factories.
    pub fn with_options(level: sys::OrtLoggingLevel, config: &[(&str, &str)]) -> Env {
        unsafe {
            let mut kv = std::ptr::null_mut();
            call!(CreateKeyValuePairs(&mut kv));
            for (k, v) in config {
                call!(AddKeyValuePair(kv, cstring(k).as_ptr(), cstring(v).as_ptr()));
            }
            let options = sys::OrtEnvCreationOptions {
                version: sys::ORT_API_VERSION,
                logging_severity_level: level as i32,
                log_id: c"kiln-tests".as_ptr(),
                custom_logging_function: Some(capture_log),
                custom_logging_param: std::ptr::null_mut(),
                threading_options: std::ptr::null(),
                config_entries: kv,
            };
            let mut env = std::ptr::null_mut();
            check(call!(CreateEnvWithOptions(&options, &mut env))).expect("CreateEnvWithOptions");
            call!(ReleaseKeyValuePairs(kv));
            Env(env)
        }
    }

    pub fn register(&self, name: &str, path: &Path) -> OrtResult<()> {
        let path = cstring(path.to_str().unwrap());
        // SAFETY: live env, valid strings.
        check(unsafe {
            call!(RegisterExecutionProviderLibrary(
                self.0,
                cstring(name).as_ptr(),
                path.as_ptr()
            ))
        })
    }

    pub fn unregister(&self, name: &str) -> OrtResult<()> {
        // SAFETY: live env, valid string.
        check(unsafe { call!(UnregisterExecutionProviderLibrary(self.0, cstring(name).as_ptr())) })
    }

    pub fn ep_devices(&self) -> Vec<EpDevice> {
        let (mut list, mut n) = (std::ptr::null(), 0usize);
        // SAFETY: live env; the list is borrowed from it.
        unsafe {
            check(call!(GetEpDevices(self.0, &mut list, &mut n))).expect("GetEpDevices");
            (0..n).map(|i| EpDevice::read(*list.add(i))).collect()
        }
    }

    pub fn kiln_devices(&self) -> Vec<EpDevice> {
        self.ep_devices()
            .into_iter()
            .filter(|d| d.ep_name == "KilnExecutionProvider")
            .collect()
    }
}

/// An OrtEpDevice and what ORT reports about it.
#[derive(Clone, Debug)]
pub struct EpDevice {
    pub ptr: *const sys::OrtEpDevice,
    pub ep_name: String,
    pub ep_vendor: String,
    pub ep_metadata: BTreeMap<String, String>,
    pub ep_options: BTreeMap<String, String>,
    pub hw_type: sys::OrtHardwareDeviceType,
    pub hw_vendor: String,
    pub hw_vendor_id: u32,
    pub hw_device_id: u32,
    pub hw_metadata: BTreeMap<String, String>,
}

impl EpDevice {
    unsafe fn read(ptr: *const sys::OrtEpDevice) -> EpDevice {
        unsafe {
            let hw = call!(EpDevice_Device(ptr));
            EpDevice {
                ptr,
                ep_name: string(call!(EpDevice_EpName(ptr))),
                ep_vendor: string(call!(EpDevice_EpVendor(ptr))),
                ep_metadata: kv_map(call!(EpDevice_EpMetadata(ptr))),
                ep_options: kv_map(call!(EpDevice_EpOptions(ptr))),
                hw_type: call!(HardwareDevice_Type(hw)),
                hw_vendor: string(call!(HardwareDevice_Vendor(hw))),
                hw_vendor_id: call!(HardwareDevice_VendorId(hw)),
                hw_device_id: call!(HardwareDevice_DeviceId(hw)),
                hw_metadata: kv_map(call!(HardwareDevice_Metadata(hw))),
            }
        }
    }

    pub fn target(&self) -> &str {
        self.ep_metadata.get("kiln.target").map(String::as_str).unwrap_or("")
    }

    pub fn is_virtual(&self) -> bool {
        self.hw_metadata.get("is_virtual").map(String::as_str) == Some("1")
    }
}

/// Session options under construction.
pub struct SessionOptions(pub *mut sys::OrtSessionOptions);

impl SessionOptions {
    pub fn new() -> SessionOptions {
        let mut p = std::ptr::null_mut();
        check(unsafe { call!(CreateSessionOptions(&mut p)) }).unwrap();
        SessionOptions(p)
    }

    pub fn config(self, key: &str, value: &str) -> SessionOptions {
        check(unsafe {
            call!(AddSessionConfigEntry(
                self.0,
                cstring(key).as_ptr(),
                cstring(value).as_ptr()
            ))
        })
        .unwrap();
        self
    }

    pub fn threads(self, n: i32) -> SessionOptions {
        check(unsafe { call!(SetIntraOpNumThreads(self.0, n)) }).unwrap();
        self
    }

    /// Appends the EP of `devices` with EP options `options`, plus `claim=all`
    /// unless `options` sets `claim`: these tests use toy graphs that kiln's
    /// default cost rule would leave to ORT.
    pub fn with_devices(self, env: &Env, devices: &[&EpDevice], options: &[(&str, &str)]) -> OrtResult<SessionOptions> {
        let mut options = options.to_vec();
        if !options.iter().any(|(k, _)| *k == "claim") {
            options.push(("claim", "all"));
        }
        let ptrs: Vec<_> = devices.iter().map(|d| d.ptr).collect();
        let keys: Vec<CString> = options.iter().map(|(k, _)| cstring(k)).collect();
        let vals: Vec<CString> = options.iter().map(|(_, v)| cstring(v)).collect();
        let kp: Vec<_> = keys.iter().map(|k| k.as_ptr()).collect();
        let vp: Vec<_> = vals.iter().map(|v| v.as_ptr()).collect();
        check(unsafe {
            call!(SessionOptionsAppendExecutionProvider_V2(
                self.0,
                env.0,
                ptrs.as_ptr(),
                ptrs.len(),
                kp.as_ptr(),
                vp.as_ptr(),
                kp.len()
            ))
        })?;
        Ok(self)
    }

    pub fn session(&self, env: &Env, model: &Path) -> OrtResult<Session> {
        let mut s = std::ptr::null_mut();
        let path = cstring(model.to_str().unwrap());
        check(unsafe { call!(CreateSession(env.0, path.as_ptr(), self.0, &mut s)) })?;
        Ok(Session(s))
    }

    pub fn session_from_bytes(&self, env: &Env, bytes: &[u8]) -> OrtResult<Session> {
        let mut s = std::ptr::null_mut();
        check(unsafe {
            call!(CreateSessionFromArray(
                env.0,
                bytes.as_ptr().cast(),
                bytes.len(),
                self.0,
                &mut s
            ))
        })?;
        Ok(Session(s))
    }
}

impl Drop for SessionOptions {
    fn drop(&mut self) {
        unsafe { call!(ReleaseSessionOptions(self.0)) };
    }
}

/// A float tensor: shape and data.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(shape: &[usize], data: Vec<f32>) -> Tensor {
        assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor {
            shape: shape.to_vec(),
            data,
        }
    }

    /// Deterministic values in [-2, 2).
    pub fn pattern(shape: &[usize], seed: u32) -> Tensor {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|i| {
                ((i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed.wrapping_mul(40503))
                    % 4001) as f32
                    / 1000.0
                    - 2.0
            })
            .collect();
        Tensor::new(shape, data)
    }
}

pub struct Session(pub *mut sys::OrtSession);

// SAFETY: ORT sessions may be run from several threads at once.
unsafe impl Send for Session {}
unsafe impl Sync for Session {}

impl Session {
    pub fn run(&self, inputs: &[(&str, &Tensor)], outputs: &[&str]) -> OrtResult<Vec<Tensor>> {
        unsafe {
            let mut mem = std::ptr::null_mut();
            check(call!(CreateCpuMemoryInfo(
                sys::OrtDeviceAllocator,
                sys::OrtMemTypeDefault,
                &mut mem
            )))
            .unwrap();
            let mut values = Vec::new();
            let mut owned: Vec<Vec<f32>> = inputs.iter().map(|(_, t)| t.data.clone()).collect();
            for ((_, t), data) in inputs.iter().zip(owned.iter_mut()) {
                let dims: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
                let mut v = std::ptr::null_mut();
                check(call!(CreateTensorWithDataAsOrtValue(
                    mem,
                    data.as_mut_ptr().cast(),
                    data.len() * 4,
                    dims.as_ptr(),
                    dims.len(),
                    sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                    &mut v
                )))
                .unwrap();
                values.push(v);
            }
            let in_names: Vec<CString> = inputs.iter().map(|(n, _)| cstring(n)).collect();
            let in_ptrs: Vec<_> = in_names.iter().map(|n| n.as_ptr()).collect();
            let out_names: Vec<CString> = outputs.iter().map(|n| cstring(n)).collect();
            let out_ptrs: Vec<_> = out_names.iter().map(|n| n.as_ptr()).collect();
            let mut outs = vec![std::ptr::null_mut(); outputs.len()];
            let value_ptrs: Vec<*const sys::OrtValue> = values.iter().map(|v| v.cast_const()).collect();
            let status = call!(Run(
                self.0,
                std::ptr::null(),
                in_ptrs.as_ptr(),
                value_ptrs.as_ptr(),
                values.len(),
                out_ptrs.as_ptr(),
                outs.len(),
                outs.as_mut_ptr()
            ));
            for v in values {
                call!(ReleaseValue(v));
            }
            call!(ReleaseMemoryInfo(mem));
            check(status)?;
            Ok(outs.into_iter().map(|v| read_tensor(v)).collect())
        }
    }
}

unsafe fn read_tensor(v: *mut sys::OrtValue) -> Tensor {
    unsafe {
        let mut info = std::ptr::null_mut();
        check(call!(GetTensorTypeAndShape(v, &mut info))).unwrap();
        let (mut rank, mut n) = (0usize, 0usize);
        check(call!(GetDimensionsCount(info, &mut rank))).unwrap();
        let mut dims = vec![0i64; rank];
        check(call!(GetDimensions(info, dims.as_mut_ptr(), rank))).unwrap();
        check(call!(GetTensorShapeElementCount(info, &mut n))).unwrap();
        call!(ReleaseTensorTypeAndShapeInfo(info));
        let mut data = std::ptr::null_mut();
        check(call!(GetTensorMutableData(v, &mut data))).unwrap();
        let out = if n == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(data as *const f32, n).to_vec()
        };
        call!(ReleaseValue(v));
        Tensor::new(&dims.iter().map(|&d| d as usize).collect::<Vec<_>>(), out)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        unsafe { call!(ReleaseSession(self.0)) };
    }
}

/// kiln's counters, read through the exported `kiln_ep_stats`.
pub fn kiln_stats() -> kiln_ep::stats::KilnStats {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    let lib = LIB.get_or_init(|| unsafe { libloading::Library::new(kiln_library_path()) }.expect("load kiln"));
    let mut out = kiln_ep::stats::KilnStats::default();
    // SAFETY: exported with this signature (include/kiln_ep.h); `out` is writable.
    let size = unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn(*mut kiln_ep::stats::KilnStats, usize) -> usize> =
            lib.get(b"kiln_ep_stats").unwrap();
        f(&mut out, std::mem::size_of_val(&out))
    };
    assert_eq!(
        size,
        std::mem::size_of_val(&out),
        "library and test disagree on KilnStats"
    );
    out
}

/// Largest absolute difference, after checking shapes match.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape, b.shape);
    a.data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn assert_close(kiln: &Tensor, cpu: &Tensor) {
    assert_eq!(kiln.shape, cpu.shape);
    for (i, (x, y)) in kiln.data.iter().zip(&cpu.data).enumerate() {
        let tol = 1e-6 + 1e-5 * y.abs();
        assert!((x - y).abs() <= tol, "element {i}: kiln {x} vs CPU EP {y}");
    }
}

/// The compile API (OrtCompileApi), for EPContext tests.
pub fn compile_api() -> &'static sys::OrtCompileApi {
    // SAFETY: GetCompileApi returns ORT's static table.
    unsafe { &*call!(GetCompileApi()) }
}

macro_rules! ccall {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        (crate::common::compile_api().$name.expect(stringify!($name)))($($arg),*)
    };
}

/// Where CompileModel reads the model from.
pub enum CompileInput<'a> {
    Path(&'a Path),
    Bytes(&'a [u8]),
}

/// Where CompileModel writes the model to.
pub enum CompileOutput<'a> {
    Path(&'a Path),
    /// Returned from `compile` as bytes (SetOutputModelBuffer).
    Buffer,
    /// Through a write callback (SetOutputModelWriteFunc).
    Stream,
}

unsafe extern "C" fn write_to_vec(
    state: *mut std::ffi::c_void,
    buf: *const std::ffi::c_void,
    n: usize,
) -> *mut sys::OrtStatus {
    // SAFETY: state is the Vec passed below; buf holds n bytes.
    unsafe {
        let out = &mut *(state as *mut Vec<u8>);
        out.extend_from_slice(std::slice::from_raw_parts(buf as *const u8, n));
    }
    std::ptr::null_mut()
}

/// Compiles a model with the EPs of `options`. Returns the output bytes for
/// buffer and stream outputs.
pub fn compile(
    env: &Env,
    options: &SessionOptions,
    input: CompileInput<'_>,
    output: CompileOutput<'_>,
    embed: bool,
    flags: u32,
) -> OrtResult<Option<Vec<u8>>> {
    unsafe {
        let mut co = std::ptr::null_mut();
        check(ccall!(CreateModelCompilationOptionsFromSessionOptions(
            env.0, options.0, &mut co
        )))?;
        let result = (|| {
            let in_path;
            match input {
                CompileInput::Path(p) => {
                    in_path = cstring(p.to_str().unwrap());
                    check(ccall!(ModelCompilationOptions_SetInputModelPath(co, in_path.as_ptr())))?;
                }
                CompileInput::Bytes(b) => check(ccall!(ModelCompilationOptions_SetInputModelFromBuffer(
                    co,
                    b.as_ptr().cast(),
                    b.len()
                )))?,
            }
            check(ccall!(ModelCompilationOptions_SetEpContextEmbedMode(co, embed)))?;
            check(ccall!(ModelCompilationOptions_SetFlags(co, flags)))?;
            let out_path;
            let mut allocator = std::ptr::null_mut();
            let (mut buf, mut len) = (std::ptr::null_mut(), 0usize);
            let mut stream: Vec<u8> = Vec::new();
            match output {
                CompileOutput::Path(p) => {
                    out_path = cstring(p.to_str().unwrap());
                    check(ccall!(ModelCompilationOptions_SetOutputModelPath(
                        co,
                        out_path.as_ptr()
                    )))?;
                }
                CompileOutput::Buffer => {
                    check(call!(GetAllocatorWithDefaultOptions(&mut allocator)))?;
                    check(ccall!(ModelCompilationOptions_SetOutputModelBuffer(
                        co, allocator, &mut buf, &mut len
                    )))?;
                }
                CompileOutput::Stream => {
                    let state = (&mut stream as *mut Vec<u8>).cast();
                    check(ccall!(ModelCompilationOptions_SetOutputModelWriteFunc(
                        co,
                        Some(write_to_vec),
                        state
                    )))?;
                }
            }
            check(ccall!(CompileModel(env.0, co)))?;
            Ok(match output {
                CompileOutput::Path(_) => None,
                CompileOutput::Buffer => {
                    let bytes = std::slice::from_raw_parts(buf as *const u8, len).to_vec();
                    check(call!(AllocatorFree(allocator, buf)))?;
                    Some(bytes)
                }
                CompileOutput::Stream => Some(stream),
            })
        })();
        ccall!(ReleaseModelCompilationOptions(co));
        result
    }
}

impl Session {
    /// A custom metadata entry of the session's model (`None` if absent).
    pub fn metadata(&self, key: &str) -> Option<String> {
        unsafe {
            let mut meta = std::ptr::null_mut();
            check(call!(SessionGetModelMetadata(self.0, &mut meta))).unwrap();
            let mut allocator = std::ptr::null_mut();
            check(call!(GetAllocatorWithDefaultOptions(&mut allocator))).unwrap();
            let mut value = std::ptr::null_mut();
            check(call!(ModelMetadataLookupCustomMetadataMap(
                meta,
                allocator,
                cstring(key).as_ptr(),
                &mut value
            )))
            .unwrap();
            let out = (!value.is_null()).then(|| string(value));
            if !value.is_null() {
                check(call!(AllocatorFree(allocator, value.cast()))).unwrap();
            }
            call!(ReleaseModelMetadata(meta));
            out
        }
    }
}

/// ORT's verdict (OrtCompiledModelCompatibility) on `info` for these devices.
pub fn model_compatibility(devices: &[&EpDevice], info: &str) -> OrtResult<sys::OrtCompiledModelCompatibility> {
    let ptrs: Vec<_> = devices.iter().map(|d| d.ptr).collect();
    let mut out = sys::OrtCompiledModelCompatibility_EP_NOT_APPLICABLE;
    check(unsafe {
        call!(GetModelCompatibilityForEpDevices(
            ptrs.as_ptr(),
            ptrs.len(),
            cstring(info).as_ptr(),
            &mut out
        ))
    })?;
    Ok(out)
}

/// The test process's ORT environment (warnings only), for test binaries
/// that share one registration of kiln.
pub fn quiet_env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| Env::with_options(sys::ORT_LOGGING_LEVEL_WARNING, &[]))
}

/// Registers kiln once per process under `name` in `quiet_env()` and runs
/// tests one at a time (ORT's environment and kiln's workspace are process-wide).
pub fn serial_registered(name: &'static str) -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    static REGISTERED: OnceLock<()> = OnceLock::new();
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    REGISTERED.get_or_init(|| quiet_env().register(name, &kiln_library_path()).unwrap());
    guard
}
