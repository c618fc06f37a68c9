//! kiln's newer ABI members and its lifetime, through ORT's C API, in a
//! process of its own (it unregisters kiln while sessions are alive):
//! - ORT calls `GetHardwareDeviceIncompatibilityDetails` (OrtApi slot 399)
//!   on kiln's factory for every hardware device it knows;
//! - ORT asks `IsConcurrentRunSupported` and calls `OnSessionInitializationEnd`
//!   once per session;
//! - a session outlives `UnregisterExecutionProviderLibrary`: it still runs,
//!   its release frees kiln's factory, and kiln registers again afterwards;
//! - `ReleaseEpFactory` returns an error for NULL and foreign pointers.

mod common;

use std::ffi::CStr;
use std::sync::Mutex;

use common::*;
use kiln_ep::ffi::sys;

static SERIAL: Mutex<()> = Mutex::new(());

/// Calls an OrtApi slot of the test's runtime.
macro_rules! call {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        (common::ort().api.$name.expect(stringify!($name)))($($arg),*)
    };
}

fn env() -> &'static Env {
    quiet_env()
}

fn host_device() -> EpDevice {
    env()
        .kiln_devices()
        .into_iter()
        .find(|d| !d.is_virtual())
        .expect("kiln host device")
}

fn run_add_mul_relu(session: &Session) -> Tensor {
    let (a, b) = (Tensor::pattern(&[2, 3, 4], 1), Tensor::pattern(&[2, 3, 4], 2));
    session.run(&[("A", &a), ("B", &b)], &["Y"]).unwrap().remove(0)
}

fn kiln_session() -> Session {
    SessionOptions::new()
        .config("session.disable_cpu_ep_fallback", "1")
        .with_devices(env(), &[&host_device()], &[])
        .unwrap()
        .session(env(), &model("add_mul_relu.onnx"))
        .expect("kiln session")
}

fn cpu_reference() -> Tensor {
    let cpu = SessionOptions::new()
        .session(env(), &model("add_mul_relu.onnx"))
        .unwrap();
    run_add_mul_relu(&cpu)
}

/// (reasons bitmask, error code, notes) ORT reports for kiln on `hw`.
fn incompatibility(hw: *const sys::OrtHardwareDevice) -> (u32, i32, String) {
    let mut details = std::ptr::null_mut();
    // SAFETY: live env and device; ORT hands us a details object to release.
    unsafe {
        check(call!(GetHardwareDeviceEpIncompatibilityDetails(
            env().0,
            c"KilnExecutionProvider".as_ptr(),
            hw,
            &mut details
        )))
        .unwrap();
        let (mut reasons, mut code, mut notes) = (0u32, 0i32, std::ptr::null());
        check(call!(DeviceEpIncompatibilityDetails_GetReasonsBitmask(
            details,
            &mut reasons
        )))
        .unwrap();
        check(call!(DeviceEpIncompatibilityDetails_GetErrorCode(details, &mut code))).unwrap();
        check(call!(DeviceEpIncompatibilityDetails_GetNotes(details, &mut notes))).unwrap();
        let notes = if notes.is_null() {
            String::new()
        } else {
            CStr::from_ptr(notes).to_string_lossy().into_owned()
        };
        call!(ReleaseDeviceEpIncompatibilityDetails(details));
        (reasons, code, notes)
    }
}

fn hardware_devices() -> Vec<*const sys::OrtHardwareDevice> {
    let mut n = 0usize;
    // SAFETY: live env; the array holds `n` borrowed devices.
    unsafe {
        check(call!(GetNumHardwareDevices(env().0, &mut n))).unwrap();
        let mut list = vec![std::ptr::null(); n];
        check(call!(GetHardwareDevices(env().0, list.as_mut_ptr(), n))).unwrap();
        list
    }
}

#[test]
fn ort_asks_kiln_about_every_hardware_device() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    env().register("kiln_hw", &kiln_library_path()).unwrap();
    let before = kiln_stats().device_queries;
    let devices = hardware_devices();
    assert!(!devices.is_empty());
    for &hw in &devices {
        // SAFETY: a device ORT listed.
        let kind = unsafe { call!(HardwareDevice_Type(hw)) };
        let (reasons, code, notes) = incompatibility(hw);
        if kind == sys::OrtHardwareDeviceType_CPU {
            assert_eq!((reasons, code), (0, 0), "{notes}");
            assert!(
                notes.starts_with("kiln runs on this CPU with target x86_64-"),
                "{notes}"
            );
        } else {
            assert_eq!(
                reasons,
                sys::OrtDeviceEpIncompatibility_DEVICE_INCOMPATIBLE as u32,
                "{notes}"
            );
        }
    }
    assert_eq!(kiln_stats().device_queries - before, devices.len() as u64);
    env().unregister("kiln_hw").unwrap();
}

#[test]
fn session_outlives_unregister_and_kiln_registers_again() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let want = cpu_reference();
    let before = kiln_stats();
    env().register("kiln_life", &kiln_library_path()).unwrap();
    let session = kiln_session();
    let mid = kiln_stats();
    assert_eq!(mid.concurrency_queries - before.concurrency_queries, 1);
    assert_eq!(mid.sessions_initialized - before.sessions_initialized, 1);
    env().unregister("kiln_life").unwrap();
    assert_close(&run_add_mul_relu(&session), &want);
    assert_eq!(
        kiln_stats().factories_freed,
        mid.factories_freed,
        "factory freed under a live EP"
    );
    drop(session);
    let after = kiln_stats();
    assert_eq!(
        after.factories_freed - mid.factories_freed,
        1,
        "the last EP frees the released factory"
    );
    assert_eq!(after.eps_released - before.eps_released, 1);

    env().register("kiln_life_again", &kiln_library_path()).unwrap();
    assert_close(&run_add_mul_relu(&kiln_session()), &want);
    env().unregister("kiln_life_again").unwrap();
    let end = kiln_stats();
    assert_eq!(end.factories_created - end.factories_freed, 0);
}

#[test]
fn release_ep_factory_refuses_null_and_foreign_pointers() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    env().register("kiln_rel", &kiln_library_path()).unwrap();
    // SAFETY: kiln exports ReleaseEpFactory with this signature; it must
    // only look the pointer up, never dereference it.
    unsafe {
        let lib = libloading::Library::new(kiln_library_path()).unwrap();
        let release: libloading::Symbol<unsafe extern "C" fn(*mut sys::OrtEpFactory) -> *mut sys::OrtStatus> =
            lib.get(b"ReleaseEpFactory").unwrap();
        let mut bogus = [0u64; 32];
        for ptr in [
            std::ptr::null_mut(),
            bogus.as_mut_ptr().cast::<sys::OrtEpFactory>(),
            0x10 as *mut _,
        ] {
            let err = check(release(ptr)).expect_err("ReleaseEpFactory accepted a pointer kiln never made");
            assert_eq!(err.code, sys::ORT_INVALID_ARGUMENT, "{}", err.message);
            assert!(
                err.message.contains("NULL") || err.message.contains("not a live kiln factory"),
                "{}",
                err.message
            );
        }
    }
    env().unregister("kiln_rel").unwrap();
}
