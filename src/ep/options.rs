//! kiln's EP options and the session configuration it reads in CreateEp.
//! ORT-free: works on the (key, value) entries the session carries.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::ir::SUPPORTED_OPS;
use crate::target::Target;

/// ORT adds every EP option under `ep.<lower-case EP name>.`.
pub const OPTION_PREFIX: &str = "ep.kilnexecutionprovider.";

/// kiln's options, as a user passes them to `add_provider_for_devices` or
/// `SessionOptionsAppendExecutionProvider_V2`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KilnOptions {
    /// Compile for this target instead of the selected device's.
    pub target: Option<Target>,
    /// Op types kiln must leave to other EPs (as spelled in `ir::SUPPORTED_OPS`).
    pub disabled_ops: Vec<String>,
    /// Which supported nodes kiln claims (`claim`).
    pub claim: ClaimPolicy,
    /// Op types kiln claims wherever it can run them, whatever the cost rule
    /// says (`force_ops`; `disabled_ops` wins over it).
    pub force_ops: Vec<String>,
    /// How a loaded context binary is held in memory.
    pub context_storage: ContextStorage,
    /// How many input shape signatures each shape-generic partition keeps a
    /// program for (`None`: the default, 8).
    pub shape_cache: Option<usize>,
    /// Whether 3×3 convolutions may run as Winograd's (`winograd`, default
    /// on): off keeps the direct convolution's roundings, at its speed.
    pub winograd: bool,
}

impl Default for KilnOptions {
    fn default() -> Self {
        KilnOptions {
            target: None,
            disabled_ops: Vec::new(),
            claim: ClaimPolicy::default(),
            force_ops: Vec::new(),
            context_storage: ContextStorage::default(),
            shape_cache: None,
            winograd: true,
        }
    }
}

/// `winograd`'s values.
const ON_OFF: [&str; 2] = ["on", "off"];

fn parse_on_off(value: &str) -> Option<bool> {
    match value.trim() {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

fn on_off() -> String {
    ON_OFF.join(", ")
}

/// The largest `shape_cache` kiln accepts.
pub const MAX_SHAPE_CACHE: usize = 1024;

/// `context_storage`: how kiln holds a `<model>_kiln.bin` it loads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextStorage {
    /// Map the file read-only and use the weights in place. The file must not
    /// be truncated or rewritten in place while a session uses it.
    #[default]
    Map,
    /// Copy the file into kiln-owned memory at load: later changes to the
    /// file cannot reach a live session.
    Copy,
}

impl ContextStorage {
    pub const NAMES: [&'static str; 2] = ["map", "copy"];

    pub fn parse(value: &str) -> Option<ContextStorage> {
        match value.trim() {
            "map" => Some(ContextStorage::Map),
            "copy" => Some(ContextStorage::Copy),
            _ => None,
        }
    }
}

/// `claim`: which of the nodes kiln can run it takes from ORT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClaimPolicy {
    /// Only partitions that kiln's cost rule says run faster in kiln than
    /// left to ORT (see `ep::cost`).
    #[default]
    Cost,
    /// Every node kiln can run (for experiments and op tests).
    All,
}

impl ClaimPolicy {
    pub const NAMES: [&'static str; 2] = ["cost", "all"];

    pub fn parse(value: &str) -> Option<ClaimPolicy> {
        match value.trim() {
            "cost" => Some(ClaimPolicy::Cost),
            "all" => Some(ClaimPolicy::All),
            _ => None,
        }
    }
}

/// One option: its key, what it accepts, and its default on a device.
pub struct OptionSpec {
    pub key: &'static str,
    pub accepts: fn() -> String,
}

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        key: "target",
        accepts: target_names,
    },
    OptionSpec {
        key: "disabled_ops",
        accepts: op_names,
    },
    OptionSpec {
        key: "claim",
        accepts: claim_names,
    },
    OptionSpec {
        key: "force_ops",
        accepts: op_names,
    },
    OptionSpec {
        key: "context_storage",
        accepts: storage_names,
    },
    OptionSpec {
        key: "shape_cache",
        accepts: shape_cache_values,
    },
    OptionSpec {
        key: "winograd",
        accepts: on_off,
    },
];

fn shape_cache_values() -> String {
    format!("an integer from 1 to {MAX_SHAPE_CACHE}")
}

fn parse_shape_cache(value: &str) -> Option<usize> {
    value
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_SHAPE_CACHE).contains(n))
}

fn claim_names() -> String {
    ClaimPolicy::NAMES.join(", ")
}

fn storage_names() -> String {
    ContextStorage::NAMES.join(", ")
}

fn target_names() -> String {
    Target::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
}

fn op_names() -> String {
    format!("a comma-separated list of: {}", SUPPORTED_OPS.join(", "))
}

fn bad_value(key: &str, value: &str) -> Error {
    let spec = OPTIONS
        .iter()
        .find(|s| s.key == key)
        .map(|s| (s.accepts)())
        .unwrap_or_default();
    Error::invalid_argument(format!(
        "invalid value '{value}' for kiln option '{key}' ({OPTION_PREFIX}{key}); accepted values: {spec}"
    ))
}

impl KilnOptions {
    /// Parses kiln's options from the session entries carrying [`OPTION_PREFIX`].
    pub fn parse(entries: &BTreeMap<String, String>) -> Result<KilnOptions> {
        let mut options = KilnOptions::default();
        for (key, value) in entries {
            let Some(name) = key.strip_prefix(OPTION_PREFIX) else {
                continue;
            };
            match name {
                "target" => options.target = Some(Target::parse(value).ok_or_else(|| bad_value(name, value))?),
                "disabled_ops" => options.disabled_ops = parse_ops(value).ok_or_else(|| bad_value(name, value))?,
                "claim" => options.claim = ClaimPolicy::parse(value).ok_or_else(|| bad_value(name, value))?,
                "force_ops" => options.force_ops = parse_ops(value).ok_or_else(|| bad_value(name, value))?,
                "context_storage" => {
                    options.context_storage = ContextStorage::parse(value).ok_or_else(|| bad_value(name, value))?
                }
                "shape_cache" => {
                    options.shape_cache = Some(parse_shape_cache(value).ok_or_else(|| bad_value(name, value))?)
                }
                "winograd" => options.winograd = parse_on_off(value).ok_or_else(|| bad_value(name, value))?,
                _ => return Err(unknown_option(name)),
            }
        }
        Ok(options)
    }
}

fn unknown_option(name: &str) -> Error {
    let known: Vec<_> = OPTIONS.iter().map(|s| s.key).collect();
    Error::invalid_argument(format!(
        "unknown kiln option '{name}' ({OPTION_PREFIX}{name}); accepted options: {}",
        known.join(", ")
    ))
}

fn parse_ops(value: &str) -> Option<Vec<String>> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            SUPPORTED_OPS
                .iter()
                .find(|o| o.eq_ignore_ascii_case(s))
                .map(|o| o.to_string())
        })
        .collect()
}

/// ORT's EPContext keys (used from issue #3 on; read and checked now so a
/// bad value fails at session creation, where the user can see it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContextConfig {
    pub enable: bool,
    pub file_path: Option<String>,
    pub embed_mode: bool,
    pub node_name_prefix: String,
    pub share: bool,
    pub stop_share: bool,
}

/// Everything kiln reads from the session configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionConfig {
    pub kiln: KilnOptions,
    pub context: ContextConfig,
    /// `session.compile_only=1`: the compile API is running, nothing will execute.
    pub compile_only: bool,
}

fn flag(entries: &BTreeMap<String, String>, key: &str, default: bool) -> Result<bool> {
    match entries.get(key).map(|v| v.trim()) {
        None | Some("") => Ok(default),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(Error::invalid_argument(format!(
            "invalid value '{other}' for session option '{key}'; accepted values: 0, 1"
        ))),
    }
}

impl SessionConfig {
    pub fn parse(entries: impl IntoIterator<Item = (String, String)>) -> Result<SessionConfig> {
        let entries: BTreeMap<String, String> = entries.into_iter().collect();
        let non_empty = |k: &str| entries.get(k).filter(|v| !v.is_empty()).cloned();
        Ok(SessionConfig {
            kiln: KilnOptions::parse(&entries)?,
            context: ContextConfig {
                enable: flag(&entries, "ep.context_enable", false)?,
                file_path: non_empty("ep.context_file_path"),
                embed_mode: flag(&entries, "ep.context_embed_mode", true)?,
                node_name_prefix: non_empty("ep.context_node_name_prefix").unwrap_or_default(),
                share: flag(&entries, "ep.share_ep_contexts", false)?,
                stop_share: flag(&entries, "ep.stop_share_ep_contexts", false)?,
            },
            compile_only: flag(&entries, "session.compile_only", false)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<SessionConfig> {
        SessionConfig::parse(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.kiln, KilnOptions::default());
        assert!(c.context.embed_mode && !c.context.enable && !c.compile_only);
    }

    #[test]
    fn winograd_is_on_unless_turned_off() {
        assert!(parse(&[]).unwrap().kiln.winograd);
        let on = parse(&[("ep.kilnexecutionprovider.winograd", " on ")]).unwrap();
        let off = parse(&[("ep.kilnexecutionprovider.winograd", "off")]).unwrap();
        assert!(on.kiln.winograd && !off.kiln.winograd);
        let e = parse(&[("ep.kilnexecutionprovider.winograd", "0")]).unwrap_err();
        assert!(
            e.message.contains("'winograd'") && e.message.contains("accepted values: on, off"),
            "{}",
            e.message
        );
    }

    #[test]
    fn reads_kiln_and_context_keys() {
        let c = parse(&[
            ("ep.kilnexecutionprovider.target", "x86_64-avx2"),
            ("ep.kilnexecutionprovider.disabled_ops", "Relu, mul"),
            ("ep.context_enable", "1"),
            ("ep.context_embed_mode", "0"),
            ("ep.context_file_path", "out/m_ctx.onnx"),
            ("ep.context_node_name_prefix", "p_"),
            ("ep.share_ep_contexts", "1"),
            ("session.compile_only", "1"),
            ("session.other", "x"),
        ])
        .unwrap();
        assert_eq!(c.kiln.target, Some(Target::Avx2));
        assert_eq!(c.kiln.disabled_ops, vec!["Relu".to_string(), "Mul".to_string()]);
        assert_eq!(c.kiln.context_storage, ContextStorage::Map);
        let copy = parse(&[("ep.kilnexecutionprovider.context_storage", "copy")]).unwrap();
        assert_eq!(copy.kiln.context_storage, ContextStorage::Copy);
        assert!(c.context.enable && !c.context.embed_mode && c.context.share && c.compile_only);
        assert_eq!(c.context.file_path.as_deref(), Some("out/m_ctx.onnx"));
        assert_eq!(c.context.node_name_prefix, "p_");
    }

    #[test]
    fn claim_policy_and_forced_ops() {
        let c = parse(&[]).unwrap();
        assert_eq!((c.kiln.claim, c.kiln.force_ops.len()), (ClaimPolicy::Cost, 0));
        let c = parse(&[
            ("ep.kilnexecutionprovider.claim", "all"),
            ("ep.kilnexecutionprovider.force_ops", "relu,Add"),
        ])
        .unwrap();
        assert_eq!(c.kiln.claim, ClaimPolicy::All);
        assert_eq!(c.kiln.force_ops, vec!["Relu".to_string(), "Add".to_string()]);
        let e = parse(&[("ep.kilnexecutionprovider.claim", "some")]).unwrap_err();
        assert!(
            e.message.contains("'claim'") && e.message.contains("cost, all"),
            "{}",
            e.message
        );
        let e = parse(&[("ep.kilnexecutionprovider.force_ops", "Conv2")]).unwrap_err();
        assert!(e.message.contains("'force_ops'"), "{}", e.message);
    }

    #[test]
    fn empty_disabled_ops_is_none() {
        let c = parse(&[("ep.kilnexecutionprovider.disabled_ops", "")]).unwrap();
        assert!(c.kiln.disabled_ops.is_empty());
    }

    #[test]
    fn bad_values_name_the_option_and_accepted_values() {
        let e = parse(&[("ep.kilnexecutionprovider.target", "riscv")]).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument);
        assert!(
            e.message.contains("'target'") && e.message.contains("x86_64-avx2"),
            "{e}"
        );
        let e = parse(&[("ep.kilnexecutionprovider.disabled_ops", "Relu,QLinearConv")]).unwrap_err();
        assert!(
            e.message.contains("disabled_ops") && e.message.contains("Sigmoid"),
            "{e}"
        );
        for bad in ["mmap", "Copy", "", "map,copy"] {
            let e = parse(&[("ep.kilnexecutionprovider.context_storage", bad)]).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument);
            assert!(
                e.message
                    .contains(&format!("invalid value '{bad}' for kiln option 'context_storage'"))
                    && e.message.contains("map, copy"),
                "{e}"
            );
        }
        let e = parse(&[("ep.kilnexecutionprovider.speed", "fast")]).unwrap_err();
        assert!(
            e.message.contains("unknown kiln option 'speed'") && e.message.contains("target"),
            "{e}"
        );
        let e = parse(&[("ep.context_embed_mode", "2")]).unwrap_err();
        assert!(e.message.contains("ep.context_embed_mode"), "{e}");
    }
}
