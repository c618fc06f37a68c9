//! `OrtEpFactory`: the C struct is the first field of a `#[repr(C)]`
//! [`FactoryObj`], so each trampoline recovers the Rust object from the
//! pointer ORT passes back and calls the safe [`FactoryImpl`] trait.

use std::collections::HashSet;
use std::ffi::{c_char, CStr};
use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::api::{ort, Api};
use super::ep::{new_ep, release_ep, EpImpl};
use super::kv::{self, KeyValues};
use super::logger::Logger;
use super::status::{check, guard, guard_or, Poison, OK};
use super::{cstr_to_string, non_null, non_null_mut, slice, sys};
use crate::error::{Error, Result};
use crate::stats;

/// ORT's hardware device kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceType {
    Cpu,
    Gpu,
    Npu,
}

impl DeviceType {
    fn from_ort(t: sys::OrtHardwareDeviceType) -> DeviceType {
        match t {
            sys::OrtHardwareDeviceType_GPU => DeviceType::Gpu,
            sys::OrtHardwareDeviceType_NPU => DeviceType::Npu,
            _ => DeviceType::Cpu,
        }
    }
    fn to_ort(self) -> sys::OrtHardwareDeviceType {
        match self {
            DeviceType::Cpu => sys::OrtHardwareDeviceType_CPU,
            DeviceType::Gpu => sys::OrtHardwareDeviceType_GPU,
            DeviceType::Npu => sys::OrtHardwareDeviceType_NPU,
        }
    }
}

/// A borrowed `OrtHardwareDevice` (ORT's, or a virtual one the factory owns).
#[derive(Clone, Copy)]
pub struct HardwareDevice(*const sys::OrtHardwareDevice);

impl HardwareDevice {
    pub fn device_type(&self) -> DeviceType {
        // SAFETY: live device (ORT's for the callback, or owned by the factory).
        DeviceType::from_ort(unsafe { ort!(Api::get().ort, HardwareDevice_Type(self.0)) })
    }
    pub fn vendor(&self) -> String {
        // SAFETY: as above; the string is copied at once.
        unsafe { cstr_to_string(ort!(Api::get().ort, HardwareDevice_Vendor(self.0))) }
    }
    pub fn vendor_id(&self) -> u32 {
        // SAFETY: as above.
        unsafe { ort!(Api::get().ort, HardwareDevice_VendorId(self.0)) }
    }
    pub fn metadata(&self) -> Vec<(String, String)> {
        // SAFETY: as above; the pairs are borrowed from the device and copied.
        unsafe { kv::entries(ort!(Api::get().ort, HardwareDevice_Metadata(self.0))) }
    }
}

/// A virtual `OrtHardwareDevice` kiln created; released with the factory.
struct OwnedDevice(*mut sys::OrtHardwareDevice);

// SAFETY: an immutable ORT object; released once, from Drop.
unsafe impl Send for OwnedDevice {}

impl Drop for OwnedDevice {
    fn drop(&mut self) {
        // SAFETY: created by CreateHardwareDevice, released once.
        unsafe { ort!(Api::get().ep, ReleaseHardwareDevice(self.0)) };
    }
}

/// Where GetSupportedDevices puts the `OrtEpDevice`s it offers.
pub struct DeviceSink<'a> {
    factory: *mut sys::OrtEpFactory,
    out: &'a mut [*mut sys::OrtEpDevice],
    count: usize,
    owned: &'a Mutex<Vec<OwnedDevice>>,
}

impl DeviceSink<'_> {
    /// Offers kiln on `device` with this EP metadata and these default options.
    pub fn add(&mut self, device: HardwareDevice, metadata: &[(&str, &str)], options: &[(&str, &str)]) -> Result<()> {
        if self.count == self.out.len() {
            return Err(Error::fail(format!(
                "ORT accepts at most {} devices from kiln",
                self.out.len()
            )));
        }
        let meta = KeyValues::from_pairs(metadata.iter().copied())?;
        let opts = KeyValues::from_pairs(options.iter().copied())?;
        let mut ep_device = std::ptr::null_mut();
        // SAFETY: live factory and device; ORT copies the pairs.
        unsafe {
            check(ort!(
                Api::get().ep,
                CreateEpDevice(self.factory, device.0, meta.as_ptr(), opts.as_ptr(), &mut ep_device)
            ))?
        };
        self.out[self.count] = ep_device;
        self.count += 1;
        Ok(())
    }

    /// Creates a virtual hardware device that lives as long as the factory.
    pub fn create_virtual(
        &mut self,
        device_type: DeviceType,
        vendor_id: u32,
        device_id: u32,
        vendor: &CStr,
        metadata: &[(&str, &str)],
    ) -> Result<HardwareDevice> {
        let meta = KeyValues::from_pairs(metadata.iter().copied())?;
        let mut hw = std::ptr::null_mut();
        // SAFETY: valid arguments; ORT copies the metadata.
        unsafe {
            check(ort!(
                Api::get().ep,
                CreateHardwareDevice(
                    device_type.to_ort(),
                    vendor_id,
                    device_id,
                    vendor.as_ptr(),
                    meta.as_ptr(),
                    &mut hw
                )
            ))?
        };
        self.owned.lock().push(OwnedDevice(hw));
        Ok(HardwareDevice(hw))
    }
}

/// The device ORT chose for a session, with the EP metadata kiln gave it.
pub struct SelectedDevice {
    pub hardware: HardwareDevice,
    pub ep_metadata: Vec<(String, String)>,
}

/// ORT's verdict on a compiled model for a set of devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compatibility {
    NotApplicable,
    Optimal,
    PreferRecompilation,
    Unsupported,
}

impl Compatibility {
    fn to_ort(self) -> sys::OrtCompiledModelCompatibility {
        match self {
            Compatibility::NotApplicable => sys::OrtCompiledModelCompatibility_EP_NOT_APPLICABLE,
            Compatibility::Optimal => sys::OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL,
            Compatibility::PreferRecompilation => sys::OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION,
            Compatibility::Unsupported => sys::OrtCompiledModelCompatibility_EP_UNSUPPORTED,
        }
    }
}

/// What kiln knows of a hardware device it may be asked to run on
/// (`GetHardwareDeviceIncompatibilityDetails`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceVerdict {
    /// ORT's `OrtDeviceEpIncompatibilityReason` bits; 0 = kiln runs there.
    pub reasons: u32,
    /// kiln's own code for the reason (0 = none).
    pub error_code: i32,
    /// One readable line for the user.
    pub notes: String,
}

impl DeviceVerdict {
    pub const DEVICE_INCOMPATIBLE: u32 = sys::OrtDeviceEpIncompatibility_DEVICE_INCOMPATIBLE as u32;
}

/// What a plugin-EP factory must provide; kiln's is `ep::KilnFactory`.
pub trait FactoryImpl: Send + Sync + Sized + 'static {
    type Ep: EpImpl;
    const NAME: &'static CStr;
    const VENDOR: &'static CStr;
    const VERSION: &'static CStr;
    const VENDOR_ID: u32;

    fn supported_devices(&self, hardware: &[HardwareDevice], sink: &mut DeviceSink<'_>) -> Result<()>;
    fn create_ep(
        &self,
        devices: &[SelectedDevice],
        session_config: Vec<(String, String)>,
        logger: Logger,
    ) -> Result<Self::Ep>;
    /// Judges a compiled model's `ep_compatibility_info` for these devices.
    fn validate_compatibility(&self, devices: &[HardwareDevice], info: &str) -> Result<Compatibility>;
    /// Whether kiln can run on `device`, and why not.
    fn device_verdict(&self, device: HardwareDevice) -> DeviceVerdict;
}

/// The API version whose `OrtEpFactory` layout kiln declares and fills:
/// every member up to fn# 19 is implemented or a deliberate NULL.
pub const FACTORY_VERSION: u32 = 31;

/// Zeroed pointer slots after the declared members, so that a runtime
/// newer than kiln's declaration reads NULL, never kiln's own fields.
const RESERVED_TAIL: usize = 16;

/// When the factory's memory may go: ORT may release the factory
/// (unregistering kiln) while sessions still hold EPs that ORT will later
/// hand back through `ReleaseEp` on this very factory.
#[derive(Default)]
struct Lifetime {
    live_eps: usize,
    released: bool,
}

#[repr(C)]
struct FactoryObj<T: FactoryImpl> {
    base: sys::OrtEpFactory,
    _reserved: [usize; RESERVED_TAIL],
    imp: T,
    poison: Arc<Poison>,
    virtual_devices: Mutex<Vec<OwnedDevice>>,
    lifetime: Mutex<Lifetime>,
}

/// Addresses of live factories, so ReleaseEpFactory can refuse a pointer
/// kiln did not create (or already released).
static LIVE: Lazy<Mutex<HashSet<usize>>> = Lazy::new(|| Mutex::new(HashSet::new()));

/// Boxes `imp` behind an `OrtEpFactory` and returns the C pointer.
pub fn new_factory<T: FactoryImpl>(imp: T) -> *mut sys::OrtEpFactory {
    // SAFETY: all-zero is a valid OrtEpFactory (every slot None).
    let mut base: sys::OrtEpFactory = unsafe { std::mem::zeroed() };
    base.ort_version_supported = FACTORY_VERSION;
    base.GetName = Some(get_name::<T>);
    base.GetVendor = Some(get_vendor::<T>);
    base.GetSupportedDevices = Some(get_supported_devices::<T>);
    base.CreateEp = Some(create_ep::<T>);
    base.ReleaseEp = Some(release_ep_tramp::<T>);
    base.GetVendorId = Some(get_vendor_id::<T>);
    base.GetVersion = Some(get_version::<T>);
    // ORT 1.31 calls CreateDataTransfer without a NULL check.
    base.ValidateCompiledModelCompatibilityInfo = Some(validate_compatibility::<T>);
    base.CreateDataTransfer = Some(create_data_transfer);
    base.IsStreamAware = Some(is_stream_aware);
    // NULL: CreateAllocator/ReleaseAllocator (kiln computes in ORT's CPU
    // memory), CreateSyncStreamForDevice (not stream aware),
    // CreateExternalResourceImporterForDevice, Init/DeinitGraphicsInterop
    // (no device memory) and SelectBestModelCandidate (ORT's default choice).
    base.GetHardwareDeviceIncompatibilityDetails = Some(device_incompatibility::<T>);
    base.GetNumCustomOpDomains = Some(get_num_custom_op_domains);
    base.GetCustomOpDomains = Some(get_custom_op_domains);
    let obj = Box::new(FactoryObj {
        base,
        _reserved: [0; RESERVED_TAIL],
        imp,
        poison: Arc::default(),
        virtual_devices: Mutex::new(Vec::new()),
        lifetime: Mutex::default(),
    });
    let ptr = Box::into_raw(obj);
    LIVE.lock().insert(ptr as usize);
    stats::factory_created();
    ptr.cast()
}

/// Releases a factory made by [`new_factory`] with the same `T`: frees it
/// now, or, while EPs it created are alive, when the last of them goes.
/// Returns whether no kiln factory is left in the process.
///
/// # Safety
/// `ptr` may be anything: only a live factory made by `new_factory::<T>` is
/// touched, and ORT must not use it afterwards except to release its EPs.
pub unsafe fn release_factory<T: FactoryImpl>(ptr: *mut sys::OrtEpFactory) -> Result<bool> {
    let ptr = non_null_mut(ptr, "OrtEpFactory")?;
    let none_left = {
        let mut live = LIVE.lock();
        if !live.remove(&(ptr as usize)) {
            return Err(Error::invalid_argument(
                "ReleaseEpFactory: not a live kiln factory (never created by kiln, or already released)",
            ));
        }
        live.is_empty()
    };
    // SAFETY: listed in LIVE until just now, so it is a FactoryObj<T>.
    let free_now = {
        let f = unsafe { &*ptr.cast::<FactoryObj<T>>() };
        let mut life = f.lifetime.lock();
        life.released = true;
        life.live_eps == 0
    };
    if free_now {
        // SAFETY: created by Box::into_raw in new_factory::<T>; unlisted and no EP left.
        drop(unsafe { Box::from_raw(ptr.cast::<FactoryObj<T>>()) });
        stats::factory_freed();
    }
    Ok(none_left)
}

/// # Safety
/// `this` must be a factory made by `new_factory::<T>`.
unsafe fn obj<'a, T: FactoryImpl>(this: *const sys::OrtEpFactory) -> Result<&'a FactoryObj<T>> {
    let p = non_null(this, "OrtEpFactory")?;
    // SAFETY: the base struct is the first field of the repr(C) FactoryObj.
    Ok(unsafe { &*p.cast::<FactoryObj<T>>() })
}

unsafe extern "C" fn get_name<T: FactoryImpl>(_: *const sys::OrtEpFactory) -> *const c_char {
    T::NAME.as_ptr()
}

unsafe extern "C" fn get_vendor<T: FactoryImpl>(_: *const sys::OrtEpFactory) -> *const c_char {
    T::VENDOR.as_ptr()
}

unsafe extern "C" fn get_version<T: FactoryImpl>(_: *const sys::OrtEpFactory) -> *const c_char {
    T::VERSION.as_ptr()
}

unsafe extern "C" fn get_vendor_id<T: FactoryImpl>(_: *const sys::OrtEpFactory) -> u32 {
    T::VENDOR_ID
}

unsafe extern "C" fn get_supported_devices<T: FactoryImpl>(
    this: *mut sys::OrtEpFactory,
    devices: *const *const sys::OrtHardwareDevice,
    num_devices: usize,
    ep_devices: *mut *mut sys::OrtEpDevice,
    max_ep_devices: usize,
    num_ep_devices: *mut usize,
) -> *mut sys::OrtStatus {
    // SAFETY (whole body): pointers come from ORT with the documented counts.
    let Ok(f) = (unsafe { obj::<T>(this) }) else {
        return guard("GetSupportedDevices", None, || {
            Err(Error::invalid_argument("OrtEpFactory is NULL"))
        });
    };
    guard("GetSupportedDevices", Some(&f.poison), || {
        let hw = unsafe { slice(devices, num_devices, "devices")? };
        let hw: Vec<HardwareDevice> = hw.iter().map(|&d| HardwareDevice(d)).collect();
        let out_count = non_null_mut(num_ep_devices, "num_ep_devices")?;
        let out = if max_ep_devices == 0 {
            &mut [][..]
        } else {
            unsafe { std::slice::from_raw_parts_mut(non_null_mut(ep_devices, "ep_devices")?, max_ep_devices) }
        };
        let mut sink = DeviceSink {
            factory: this,
            out,
            count: 0,
            owned: &f.virtual_devices,
        };
        let result = f.imp.supported_devices(&hw, &mut sink);
        if result.is_err() {
            // ORT only takes the devices when we succeed.
            for d in &sink.out[..sink.count] {
                unsafe { ort!(Api::get().ep, ReleaseEpDevice(*d)) };
            }
            sink.count = 0;
        }
        unsafe { *out_count = sink.count };
        result
    })
}

unsafe extern "C" fn create_ep<T: FactoryImpl>(
    this: *mut sys::OrtEpFactory,
    devices: *const *const sys::OrtHardwareDevice,
    ep_metadata: *const *const sys::OrtKeyValuePairs,
    num_devices: usize,
    session_options: *const sys::OrtSessionOptions,
    logger: *const sys::OrtLogger,
    ep: *mut *mut sys::OrtEp,
) -> *mut sys::OrtStatus {
    // SAFETY (whole body): pointers come from ORT with the documented counts.
    let Ok(f) = (unsafe { obj::<T>(this) }) else {
        return guard("CreateEp", None, || {
            Err(Error::invalid_argument("OrtEpFactory is NULL"))
        });
    };
    guard("CreateEp", Some(&f.poison), || {
        let out = non_null_mut(ep, "ep")?;
        let hw = unsafe { slice(devices, num_devices, "devices")? };
        let meta = unsafe { slice(ep_metadata, num_devices, "ep_metadata_pairs")? };
        let selected: Vec<SelectedDevice> = hw
            .iter()
            .zip(meta)
            .map(|(&d, &m)| SelectedDevice {
                hardware: HardwareDevice(d),
                ep_metadata: unsafe { kv::entries(m) },
            })
            .collect();
        let config = unsafe { session_config_entries(session_options)? };
        let logger = unsafe { Logger::from_raw(logger) };
        let imp = f.imp.create_ep(&selected, config, logger)?;
        f.lifetime.lock().live_eps += 1;
        unsafe { *out = new_ep(imp) };
        Ok(())
    })
}

unsafe extern "C" fn release_ep_tramp<T: FactoryImpl>(this: *mut sys::OrtEpFactory, ep: *mut sys::OrtEp) {
    if ep.is_null() {
        return;
    }
    // SAFETY: `ep` was made by new_ep::<T::Ep> in create_ep.
    guard_or("ReleaseEp", None, (), || unsafe { release_ep::<T::Ep>(ep) });
    // SAFETY: `this` made `ep`, so it is still allocated (see Lifetime).
    guard_or("ReleaseEp", None, (), || unsafe { ep_released::<T>(this) });
}

/// Counts an EP gone; frees a factory ORT already released once its last EP is.
///
/// # Safety
/// `this` must be the factory that created the EP just released.
unsafe fn ep_released<T: FactoryImpl>(this: *mut sys::OrtEpFactory) -> Result<()> {
    let f = unsafe { obj::<T>(this)? };
    let free_now = {
        let mut life = f.lifetime.lock();
        life.live_eps = life.live_eps.saturating_sub(1);
        life.released && life.live_eps == 0
    };
    stats::ep_released();
    if free_now {
        // SAFETY: ORT released the factory earlier (so it is unlisted) and
        // this was its last EP: nothing refers to it any more.
        drop(unsafe { Box::from_raw(this.cast::<FactoryObj<T>>()) });
        stats::factory_freed();
    }
    Ok(())
}

unsafe extern "C" fn device_incompatibility<T: FactoryImpl>(
    this: *mut sys::OrtEpFactory,
    hw: *const sys::OrtHardwareDevice,
    details: *mut sys::OrtDeviceEpIncompatibilityDetails,
) -> *mut sys::OrtStatus {
    // SAFETY (whole body): pointers come from ORT, valid for this call.
    let Ok(f) = (unsafe { obj::<T>(this) }) else {
        return guard("GetHardwareDeviceIncompatibilityDetails", None, || {
            Err(Error::invalid_argument("OrtEpFactory is NULL"))
        });
    };
    guard("GetHardwareDeviceIncompatibilityDetails", Some(&f.poison), || {
        let hw = HardwareDevice(non_null(hw, "hardware device")?);
        let details = non_null_mut(details, "incompatibility details")?;
        stats::device_queried();
        let verdict = f.imp.device_verdict(hw);
        let notes = std::ffi::CString::new(verdict.notes.replace('\0', " ")).unwrap_or_default();
        unsafe {
            check(ort!(
                Api::get().ep,
                DeviceEpIncompatibilityDetails_SetDetails(details, verdict.reasons, verdict.error_code, notes.as_ptr())
            ))
        }
    })
}

unsafe extern "C" fn get_num_custom_op_domains(_: *mut sys::OrtEpFactory, num: *mut usize) -> *mut sys::OrtStatus {
    // kiln registers no custom operators.
    if !num.is_null() {
        // SAFETY: non-NULL out-pointer from ORT.
        unsafe { *num = 0 };
    }
    OK
}

unsafe extern "C" fn get_custom_op_domains(
    _: *mut sys::OrtEpFactory,
    _domains: *mut *mut sys::OrtCustomOpDomain,
    num: usize,
) -> *mut sys::OrtStatus {
    guard("GetCustomOpDomains", None, || {
        if num == 0 {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "kiln has no custom op domains, ORT asked for {num}"
            )))
        }
    })
}

unsafe extern "C" fn validate_compatibility<T: FactoryImpl>(
    this: *mut sys::OrtEpFactory,
    devices: *const *const sys::OrtHardwareDevice,
    num_devices: usize,
    info: *const c_char,
    out: *mut sys::OrtCompiledModelCompatibility,
) -> *mut sys::OrtStatus {
    // SAFETY (whole body): pointers come from ORT with the documented counts.
    let Ok(f) = (unsafe { obj::<T>(this) }) else {
        return guard("ValidateCompiledModelCompatibilityInfo", None, || {
            Err(Error::invalid_argument("OrtEpFactory is NULL"))
        });
    };
    guard("ValidateCompiledModelCompatibilityInfo", Some(&f.poison), || {
        let out = non_null_mut(out, "model_compatibility")?;
        let hw = unsafe { slice(devices, num_devices, "devices")? };
        let hw: Vec<HardwareDevice> = hw.iter().map(|&d| HardwareDevice(d)).collect();
        let info = unsafe { cstr_to_string(info) };
        let verdict = f.imp.validate_compatibility(&hw, &info)?;
        unsafe { *out = verdict.to_ort() };
        Ok(())
    })
}

unsafe extern "C" fn create_data_transfer(
    _: *mut sys::OrtEpFactory,
    data_transfer: *mut *mut sys::OrtDataTransferImpl,
) -> *mut sys::OrtStatus {
    // kiln computes in host memory, so it needs no data transfer.
    if !data_transfer.is_null() {
        // SAFETY: non-NULL out-pointer from ORT.
        unsafe { *data_transfer = std::ptr::null_mut() };
    }
    OK
}

unsafe extern "C" fn is_stream_aware(_: *const sys::OrtEpFactory) -> bool {
    false
}

/// Copies every session configuration entry.
///
/// # Safety
/// `options` must be a live `OrtSessionOptions`.
unsafe fn session_config_entries(options: *const sys::OrtSessionOptions) -> Result<Vec<(String, String)>> {
    let options = non_null(options, "session_options")?;
    let mut pairs = std::ptr::null_mut();
    // SAFETY: live options; ORT hands us a new OrtKeyValuePairs.
    unsafe {
        check(ort!(
            Api::get().ort,
            GetSessionOptionsConfigEntries(options, &mut pairs)
        ))?;
        Ok(kv::take_entries(pairs))
    }
}

/// The environment's config entries (`allow_virtual_devices`, ...).
pub fn env_config_entries() -> Result<Vec<(String, String)>> {
    let mut pairs = std::ptr::null_mut();
    // SAFETY: ORT hands us a new OrtKeyValuePairs.
    unsafe {
        check(ort!(Api::get().ep, GetEnvConfigEntries(&mut pairs)))?;
        Ok(kv::take_entries(pairs))
    }
}
