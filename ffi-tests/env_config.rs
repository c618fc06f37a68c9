//! Virtual devices through the environment's config entries
//! (`CreateEnvWithOptions`), in a process of its own because ORT's
//! environment is a process-wide singleton.

mod common;

use common::*;
use kiln_ep::ffi::sys;

#[test]
fn allow_virtual_devices_env_entry_offers_virtual_devices() {
    let env = Env::with_options(sys::ORT_LOGGING_LEVEL_WARNING, &[("allow_virtual_devices", "1")]);
    env.register("kiln_envcfg", &kiln_library_path()).unwrap();
    let devices = env.kiln_devices();
    assert_eq!(devices.len(), 3, "{devices:?}");
    assert_eq!(devices.iter().filter(|d| d.is_virtual()).count(), 2);
    env.unregister("kiln_envcfg").unwrap();
}
