//! The EPContext node as kiln writes and reads it — op, domain, attribute
//! names, types and defaults — and the ORT-free reading of the attributes
//! kiln acts on (fuzzed by `crate::fuzzing`). The reader (`reader`), the
//! writer (`writer`) and the compiled-model checks (`models`) take every name
//! and default from here.

pub const EP_CONTEXT_OP: &str = "EPContext";
pub const EP_CONTEXT_DOMAIN: &str = "com.microsoft";

// Attributes (ONNX type in brackets). kiln acts on the first five; the rest
// are for people and tools (the binary carries the authoritative values).
/// [STRING] the EP that wrote the node.
pub const SOURCE: &str = "source";
/// [STRING] the key of the node's graph inside the context binary.
pub const PARTITION_NAME: &str = "partition_name";
/// [INT] 1: `ep_cache_context` is the binary; 0: a file name. Default [`EMBED_MODE_DEFAULT`].
pub const EMBED_MODE: &str = "embed_mode";
/// [INT] 1 for the node naming the binary, 0 for nodes found in it. Default [`MAIN_CONTEXT_DEFAULT`].
pub const MAIN_CONTEXT: &str = "main_context";
/// [STRING] the binary (embed mode 1) or its path relative to the model (embed mode 0).
pub const EP_CACHE_CONTEXT: &str = "ep_cache_context";
/// [STRING] ops, steps, sizes; on the main node also the binary's checksum stamp.
pub const NOTES: &str = "notes";
/// [STRING] kiln's version and context format.
pub const EP_SDK_VERSION: &str = "ep_sdk_version";
/// [STRING] the target the graph was compiled for.
pub const HARDWARE_ARCHITECTURE: &str = "hardware_architecture";
/// [STRING] the source model's file name.
pub const ONNX_MODEL_FILENAME: &str = "onnx_model_filename";
/// [INT] scratch bytes one run needs.
pub const MAX_SIZE: &str = "max_size";

/// ORT's defaults for the attributes when absent (EPContext schema).
pub const EMBED_MODE_DEFAULT: i64 = 1;
pub const MAIN_CONTEXT_DEFAULT: i64 = 1;

/// The `source` kiln writes.
pub const KILN_SOURCE: &str = "KilnExecutionProvider";

/// Whether `source` names kiln (`KilnExecutionProvider` or `kiln`, any case).
pub fn is_kiln_source(source: &str) -> bool {
    source.eq_ignore_ascii_case(KILN_SOURCE) || source.eq_ignore_ascii_case("kiln")
}

/// The longest `ep_cache_context` kiln takes for a file name.
const MAX_PATH_BYTES: usize = 4096;

/// A file name `embed_mode=0` can mean: short UTF-8 text without control characters.
fn as_file_name(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    (bytes.len() <= MAX_PATH_BYTES && !text.chars().any(char::is_control)).then_some(text)
}

/// An EPContext node's attributes as ORT holds them (`None` = absent), without
/// the node: the ORT-free part of [`ContextNode::read`], fuzzed by
/// `crate::fuzzing`. `ep_cache_context` is only read when `embed_mode` is not 1.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawContextAttrs {
    pub embed_mode: Option<i64>,
    pub main_context: Option<i64>,
    pub ep_cache_context: Option<Vec<u8>>,
    pub partition_name: Option<Vec<u8>>,
}

/// The attributes of a kiln EPContext node, defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct ContextAttrs {
    pub embed_mode: i64,
    pub main_context: i64,
    /// `ep_cache_context` when `embed_mode != 1` (an embedded payload is read later).
    pub cache_context: Option<Vec<u8>>,
    pub partition_name: String,
}

/// Where a primary node's context binary is, decided from its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BinarySource<'a> {
    /// The bytes of `ep_cache_context` (embed_mode=1).
    Embedded,
    /// A file name relative to the model's folder (embed_mode=0).
    File(&'a str),
}

impl ContextAttrs {
    /// Applies the defaults; on error also returns what was read, for the message.
    pub fn from_raw(raw: RawContextAttrs) -> std::result::Result<ContextAttrs, (ContextAttrs, String)> {
        let embed_mode = raw.embed_mode.unwrap_or(EMBED_MODE_DEFAULT);
        let attrs = ContextAttrs {
            embed_mode,
            main_context: raw.main_context.unwrap_or(MAIN_CONTEXT_DEFAULT),
            cache_context: if embed_mode == 1 { None } else { raw.ep_cache_context },
            partition_name: raw
                .partition_name
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default(),
        };
        for (name, value) in [(EMBED_MODE, attrs.embed_mode), (MAIN_CONTEXT, attrs.main_context)] {
            if value != 0 && value != 1 {
                return Err((attrs, format!("{name} {value} is not 0 or 1")));
            }
        }
        if attrs.partition_name.is_empty() {
            return Err((attrs, "it has no partition_name attribute".into()));
        }
        Ok(attrs)
    }

    /// Where the binary of a node with `main_context != 0` is.
    pub fn binary_source(&self) -> std::result::Result<BinarySource<'_>, String> {
        binary_source(self.embed_mode, self.cache_context.as_deref())
    }

    /// Where the node's compiled graph comes from, for messages.
    pub fn origin(&self) -> String {
        origin(self.main_context, self.embed_mode, self.cache_context.as_deref())
    }
}

pub fn binary_source(embed_mode: i64, cache_context: Option<&[u8]>) -> std::result::Result<BinarySource<'_>, String> {
    match embed_mode {
        1 => return Ok(BinarySource::Embedded),
        0 => {}
        _ => return Err(format!("embed_mode {embed_mode} is not 0 or 1")),
    }
    let payload = cache_context
        .filter(|p| !p.is_empty())
        .ok_or("ep_cache_context is empty or absent")?;
    let rel = as_file_name(payload)
        .ok_or("embed_mode=0 expects a file name relative to the model; was the node written with embed_mode=1?")?;
    Ok(BinarySource::File(rel))
}

pub fn origin(main_context: i64, embed_mode: i64, cache_context: Option<&[u8]>) -> String {
    match (main_context, embed_mode, cache_context) {
        (0, _, _) => "main_context=0, no file of its own".into(),
        (_, 1, _) => "embedded payload in ep_cache_context".into(),
        (_, _, Some(b)) => match as_file_name(b) {
            Some(name) => format!("file '{name}'"),
            None => format!("ep_cache_context of {} bytes that is not a file name", b.len()),
        },
        (_, _, None) => "no ep_cache_context".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kiln_sources() {
        assert!(
            is_kiln_source("KilnExecutionProvider")
                && is_kiln_source("KILN")
                && is_kiln_source("kilnexecutionprovider")
        );
        assert!(!is_kiln_source("QNNExecutionProvider") && !is_kiln_source(""));
    }

    #[test]
    fn kiln_writes_its_ep_name() {
        assert_eq!(Some(KILN_SOURCE), crate::ep::EP_NAME.to_str().ok());
    }
}
