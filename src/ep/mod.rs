//! kiln's factory and EP: the glue between ORT's callbacks (`ffi`) and the
//! ORT-free compiler. Devices, targets, options, GetCapability and Compile.

mod capability;
mod compile;
mod cost;
mod describe;
pub mod epcontext;
pub mod options;
pub mod partition;
pub mod share;

use std::ffi::{CStr, CString};

use crate::context;
use crate::error::{Error, Result};
use crate::ffi::ep::{Compiled, EpImpl, Partition, SupportInfo};
use crate::ffi::factory::{
    env_config_entries, Compatibility, DeviceSink, DeviceType, DeviceVerdict, FactoryImpl, HardwareDevice,
    SelectedDevice,
};
use crate::ffi::graph::Graph;
use crate::ffi::logger::Logger;
use crate::stats;
use crate::target::Target;
use options::SessionConfig;

pub const EP_NAME: &CStr = c"KilnExecutionProvider";
pub const VENDOR: &CStr = c"kiln";
/// ASCII "KILN": kiln has no PCI vendor id, so it uses a fixed tag.
pub const VENDOR_ID: u32 = 0x4B49_4C4E;
pub const VERSION: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
    Ok(v) => v,
    Err(_) => panic!("crate version holds a NUL"),
};

/// EP metadata key naming the target a device compiles for.
pub const META_TARGET: &str = "kiln.target";
pub const META_FEATURES: &str = "kiln.target_features";
/// Hardware-device metadata ORT and users read to spot a virtual device.
pub const META_IS_VIRTUAL: &str = "is_virtual";

/// Test hook: `KILN_INJECT_PANIC=compile` or `=compute` (read when the
/// library is registered) makes that entry point panic, so tests can prove
/// the panic boundary and poisoning against the real runtime.
pub const INJECT_PANIC_ENV: &str = "KILN_INJECT_PANIC";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InjectedPanic {
    #[default]
    None,
    Compile,
    Compute,
}

impl InjectedPanic {
    fn from_env() -> InjectedPanic {
        match std::env::var(INJECT_PANIC_ENV).as_deref() {
            Ok("compile") => InjectedPanic::Compile,
            Ok("compute") => InjectedPanic::Compute,
            _ => InjectedPanic::None,
        }
    }
}

/// One per `RegisterExecutionProviderLibrary`.
pub struct KilnFactory {
    host: Target,
    logger: Logger,
    inject: InjectedPanic,
}

impl KilnFactory {
    pub fn new(registered_name: &str, logger: Logger) -> Result<KilnFactory> {
        let host = Target::detect_host()?;
        logger.info(|| format!("registered as '{registered_name}'; host target {}", host.name()));
        Ok(KilnFactory {
            host,
            logger,
            inject: InjectedPanic::from_env(),
        })
    }

    fn offer(&self, sink: &mut DeviceSink<'_>, device: HardwareDevice, target: Target) -> Result<()> {
        sink.add(
            device,
            &[(META_TARGET, target.name()), (META_FEATURES, target.description())],
            &[("target", target.name()), ("disabled_ops", "")],
        )
    }
}

fn allow_virtual_devices() -> Result<bool> {
    Ok(env_config_entries()?
        .iter()
        .any(|(k, v)| k == "allow_virtual_devices" && v == "1"))
}

impl FactoryImpl for KilnFactory {
    type Ep = KilnEp;
    const NAME: &'static CStr = EP_NAME;
    const VENDOR: &'static CStr = VENDOR;
    const VERSION: &'static CStr = VERSION;
    const VENDOR_ID: u32 = VENDOR_ID;

    fn supported_devices(&self, hardware: &[HardwareDevice], sink: &mut DeviceSink<'_>) -> Result<()> {
        let Some(&cpu) = hardware.iter().find(|d| d.device_type() == DeviceType::Cpu) else {
            self.logger.warning("ORT listed no CPU device; kiln offers none");
            return Ok(());
        };
        self.offer(sink, cpu, self.host)?;
        if !allow_virtual_devices()? {
            return Ok(());
        }
        for (id, target) in Target::ALL.into_iter().enumerate().filter(|(_, t)| *t != self.host) {
            let meta = [(META_IS_VIRTUAL, "1"), (META_TARGET, target.name())];
            let device = sink.create_virtual(DeviceType::Cpu, VENDOR_ID, id as u32, VENDOR, &meta)?;
            self.offer(sink, device, target)?;
        }
        Ok(())
    }

    fn create_ep(&self, devices: &[SelectedDevice], session: Vec<(String, String)>, logger: Logger) -> Result<KilnEp> {
        let config = SessionConfig::parse(session)?;
        let device_target = devices
            .first()
            .and_then(|d| d.ep_metadata.iter().find(|(k, _)| k == META_TARGET))
            .and_then(|(_, v)| Target::parse(v))
            .unwrap_or(self.host);
        let target = config.kiln.target.unwrap_or(device_target);
        let compiles_only = config.compile_only || config.context.enable;
        if !target.can_run_on(self.host) && !compiles_only {
            return Err(Error::invalid_argument(format!(
                "kiln target {} cannot run on this host (best: {}); a virtual device or the 'target' option \
                 above the host is for compiling only (the compile API or ep.context_enable=1)",
                target.name(),
                self.host.name()
            )));
        }
        stats::ep_created();
        logger.info(|| {
            format!(
                "session EP created for target {} (host {})",
                target.name(),
                self.host.name()
            )
        });
        Ok(KilnEp {
            target,
            host: self.host,
            config,
            logger,
            inject: self.inject,
            compat: CString::new(context::compatibility_info(target)).unwrap_or_default(),
            binaries: Default::default(),
            compiled: Default::default(),
            context_files: Default::default(),
        })
    }

    fn validate_compatibility(&self, devices: &[HardwareDevice], info: &str) -> Result<Compatibility> {
        let targets: Vec<Target> = devices.iter().map(|d| self.device_target(d)).collect();
        let targets = if targets.is_empty() { vec![self.host] } else { targets };
        // The best answer over the devices the session may use.
        let (verdict, reason) = targets
            .iter()
            .map(|&t| context::check_compatibility(info, t))
            .min_by_key(|(c, _)| rank(*c))
            .expect("at least one target");
        self.logger
            .info(|| format!("compiled model compatibility '{info}': {verdict:?} ({reason})"));
        Ok(match verdict {
            context::Compatibility::Optimal => Compatibility::Optimal,
            context::Compatibility::PreferRecompilation => Compatibility::PreferRecompilation,
            context::Compatibility::Unsupported => Compatibility::Unsupported,
        })
    }

    fn device_verdict(&self, device: HardwareDevice) -> DeviceVerdict {
        device_verdict(device.device_type(), self.host)
    }
}

/// kiln runs on the host's CPU, for the best target the host supports; it
/// never runs on a GPU or NPU. (Virtual devices are kiln's own; ORT asks
/// about the hardware it discovered.)
fn device_verdict(kind: DeviceType, host: Target) -> DeviceVerdict {
    match kind {
        DeviceType::Cpu => DeviceVerdict {
            reasons: 0,
            error_code: 0,
            notes: format!(
                "kiln runs on this CPU with target {} ({})",
                host.name(),
                host.description()
            ),
        },
        other => DeviceVerdict {
            reasons: DeviceVerdict::DEVICE_INCOMPATIBLE,
            error_code: KILN_NOT_A_CPU,
            notes: format!("kiln runs on CPUs only; this device is a {other:?}"),
        },
    }
}

/// kiln's error code in incompatibility details: the device is not a CPU.
pub const KILN_NOT_A_CPU: i32 = 1;

fn rank(c: context::Compatibility) -> u8 {
    match c {
        context::Compatibility::Optimal => 0,
        context::Compatibility::PreferRecompilation => 1,
        context::Compatibility::Unsupported => 2,
    }
}

impl KilnFactory {
    /// A virtual device stands for its own target; ORT's CPU for the host's.
    fn device_target(&self, device: &HardwareDevice) -> Target {
        let meta = device.metadata();
        let virtual_target = meta.iter().any(|(k, v)| k == META_IS_VIRTUAL && v == "1");
        meta.iter()
            .find(|(k, _)| virtual_target && k == META_TARGET)
            .and_then(|(_, v)| Target::parse(v))
            .unwrap_or(self.host)
    }
}

/// One per session.
pub struct KilnEp {
    target: Target,
    host: Target,
    config: SessionConfig,
    logger: Logger,
    inject: InjectedPanic,
    /// `ep_compatibility_info` for models this session compiles.
    compat: CString,
    /// Context binaries this session opened (each read once).
    binaries: parking_lot::Mutex<epcontext::reader::LoadedBinaries>,
    /// Set once Compile ran (see `Drop`).
    compiled: std::sync::atomic::AtomicBool,
    /// Context binaries written but not yet in place (see `epcontext::writer`).
    context_files: epcontext::writer::ContextFiles,
}

impl KilnEp {
    /// This session as the EPContext reader and writer see it.
    fn epcontext(&self) -> epcontext::Session<'_> {
        epcontext::Session {
            config: &self.config,
            logger: &self.logger,
            target: self.target,
            host: self.host,
            binaries: &self.binaries,
            context_files: &self.context_files,
            compiled: &self.compiled,
        }
    }
}

impl Drop for KilnEp {
    /// Settles the context binaries this session staged (see `epcontext::writer`).
    fn drop(&mut self) {
        epcontext::writer::on_release(&self.epcontext());
    }
}

impl EpImpl for KilnEp {
    fn name(&self) -> &CStr {
        EP_NAME
    }

    fn logger(&self) -> Logger {
        self.logger
    }

    fn get_capability(&self, graph: Graph<'_>, support: &mut SupportInfo) -> Result<()> {
        capability::claim(self, graph, support)
    }

    fn compile(&self, partitions: &[Partition<'_>]) -> Result<Vec<Compiled>> {
        assert!(
            self.inject != InjectedPanic::Compile,
            "injected panic in Compile ({INJECT_PANIC_ENV})"
        );
        self.compiled.store(true, std::sync::atomic::Ordering::Release);
        compile::compile_all(self, partitions)
    }

    fn compatibility_info(&self) -> Option<&CStr> {
        Some(&self.compat)
    }

    /// Every kernel takes its scratch from a per-call pool and only reads
    /// the compiled program, so Runs of one session may overlap.
    fn concurrent_runs_supported(&self) -> bool {
        true
    }

    fn on_session_initialization_end(&self) -> Result<()> {
        stats::session_initialized();
        // ORT has written the session's compiled model: its binaries go in place.
        epcontext::writer::on_session_initialization_end(&self.epcontext())?;
        // The compiled programs hold their own references to the weights
        // they use; the parsed binaries only served Compile. A sharing
        // session keeps them: the shared workspace lends them to later
        // sessions only while some session holds them.
        if !self.config.context.share {
            *self.binaries.lock() = Default::default();
        }
        Ok(())
    }
}
