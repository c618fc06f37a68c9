//! A description of a context binary for tools (`kiln inspect`, the
//! `kiln_ep_inspect_context` export): what its header and metadata say,
//! whether its checksum matches, and whether [`ContextBinary::parse`] accepts
//! all of it. Never fails: a damaged file is described as far as it can be
//! read, with the first error the reader found.

use std::fmt::Write as _;
use std::sync::Arc;

use super::header::Header;
use super::{check_compatibility, Compatibility, ContextBinary, StoredGraph};
use crate::target::Target;
use crate::tensor::Storage;

/// One graph record of a binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphSummary {
    pub name: String,
    /// `program` (static shapes) or `generic` (shape-generic, built per input shape).
    pub kind: &'static str,
    /// One line, e.g. `target x86_64-avx2; ops Add x1; 2 steps; ...`.
    pub description: String,
}

/// What [`inspect`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inspection {
    pub file_bytes: u64,
    /// From the header, if its fixed part is readable.
    pub format_version: Option<u32>,
    /// The header's checksum, if its fixed part is readable.
    pub checksum: Option<u128>,
    /// Whether the contents hash to the header's checksum (`None`: the file is
    /// too short or its header unreadable, so the question has no answer).
    pub checksum_ok: Option<bool>,
    pub kiln_version: Option<String>,
    pub target: Option<Target>,
    pub graphs: Vec<GraphSummary>,
    pub weights: usize,
    pub weight_bytes: u64,
    pub context_models: Vec<String>,
    /// `None` when the whole binary is valid and loadable by this kiln.
    pub error: Option<String>,
}

impl Inspection {
    /// The compatibility string ORT would store for a model compiled into this binary.
    pub fn compatibility_info(&self) -> Option<String> {
        Some(format!(
            "kiln;format={};version={};target={}",
            self.format_version?,
            self.kiln_version.as_deref()?,
            self.target?.name()
        ))
    }

    /// The description as one JSON object (see `docs/context-format.md`,
    /// "Inspecting a binary"); `host` is the best target of the machine asking.
    pub fn to_json(&self, host: Option<Target>) -> String {
        let mut o = JsonObject::default();
        o.bool("valid", self.error.is_none());
        o.opt_str("error", self.error.as_deref());
        o.num("file_bytes", self.file_bytes);
        o.opt_num("format_version", self.format_version.map(u64::from));
        o.opt_str("checksum", self.checksum.map(|c| format!("{c:032x}")).as_deref());
        o.opt_bool("checksum_ok", self.checksum_ok);
        o.opt_str("kiln_version", self.kiln_version.as_deref());
        o.opt_str("target", self.target.map(Target::name));
        let graphs: Vec<String> = self
            .graphs
            .iter()
            .map(|g| {
                let mut go = JsonObject::default();
                go.str("name", &g.name);
                go.str("kind", g.kind);
                go.str("description", &g.description);
                go.finish()
            })
            .collect();
        o.raw("graphs", &format!("[{}]", graphs.join(",")));
        o.num("weights", self.weights as u64);
        o.num("weight_bytes", self.weight_bytes);
        let models: Vec<String> = self.context_models.iter().map(|m| quote(m)).collect();
        o.raw("context_models", &format!("[{}]", models.join(",")));
        o.str("reader_kiln_version", super::KILN_VERSION);
        o.num("reader_format_min", u64::from(super::MIN_READ_VERSION));
        o.num("reader_format_max", u64::from(super::FORMAT_VERSION));
        o.opt_str("host_target", host.map(Target::name));
        let info = self.compatibility_info();
        o.opt_str("compatibility_info", info.as_deref());
        let verdict = match (&info, host, &self.error) {
            (Some(info), Some(host), None) => Some(check_compatibility(info, host)),
            (_, _, Some(e)) => Some((Compatibility::Unsupported, format!("the binary is not loadable: {e}"))),
            _ => None,
        };
        o.opt_str("host_verdict", verdict.as_ref().map(|(c, _)| verdict_name(*c)));
        o.opt_str("host_reason", verdict.as_ref().map(|(_, why)| why.as_str()));
        o.finish()
    }
}

fn verdict_name(c: Compatibility) -> &'static str {
    match c {
        Compatibility::Optimal => "optimal",
        Compatibility::PreferRecompilation => "prefer_recompilation",
        Compatibility::Unsupported => "unsupported",
    }
}

/// Describes the binary held in `storage`.
pub fn inspect(storage: Arc<dyn Storage>) -> Inspection {
    let file = storage.bytes();
    let mut out = Inspection {
        file_bytes: file.len() as u64,
        ..Inspection::default()
    };
    if let Ok(h) = Header::parse_fixed(file) {
        out.format_version = Some(h.version);
        out.checksum = Some(h.checksum);
        out.checksum_ok = h.checksum_matches(file);
    }
    if let Ok(peek) = super::peek(&mut &file[..]) {
        out.kiln_version = Some(peek.kiln_version);
        out.context_models = peek.context_models;
    }
    match ContextBinary::parse(storage.clone()) {
        Ok(bin) => {
            out.target = Some(bin.target());
            out.weights = bin.num_weights();
            out.weight_bytes = bin.weight_bytes();
            out.graphs = bin
                .graph_names()
                .into_iter()
                .filter_map(|name| {
                    let g = bin.stored_graph(&name)?;
                    let kind = match g {
                        StoredGraph::Program(_) => "program",
                        StoredGraph::Generic(_) => "generic",
                    };
                    Some(GraphSummary {
                        name,
                        kind,
                        description: g.describe(),
                    })
                })
                .collect();
        }
        Err(e) => out.error = Some(e.message),
    }
    out
}

/// A JSON object written field by field (kiln has no JSON dependency; the
/// values here are strings, numbers, booleans and nulls).
#[derive(Default)]
struct JsonObject {
    fields: Vec<String>,
}

impl JsonObject {
    fn raw(&mut self, key: &str, value: &str) {
        self.fields.push(format!("{}:{value}", quote(key)));
    }
    fn str(&mut self, key: &str, value: &str) {
        self.raw(key, &quote(value));
    }
    fn opt_str(&mut self, key: &str, value: Option<&str>) {
        self.raw(key, &value.map_or("null".to_string(), quote));
    }
    fn num(&mut self, key: &str, value: u64) {
        self.raw(key, &value.to_string());
    }
    fn opt_num(&mut self, key: &str, value: Option<u64>) {
        self.raw(key, &value.map_or("null".to_string(), |v| v.to_string()));
    }
    fn bool(&mut self, key: &str, value: bool) {
        self.raw(key, if value { "true" } else { "false" });
    }
    fn opt_bool(&mut self, key: &str, value: Option<bool>) {
        self.raw(key, value.map_or("null", |v| if v { "true" } else { "false" }));
    }
    fn finish(self) -> String {
        format!("{{{}}}", self.fields.join(","))
    }
}

/// `s` as a JSON string literal.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_escapes_what_json_requires() {
        assert_eq!(quote("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
    }

    #[test]
    fn garbage_is_described_not_refused() {
        let ins = inspect(Arc::new(crate::tensor::AlignedBytes::copy_from(b"not a kiln file")));
        assert_eq!(ins.file_bytes, 15);
        assert_eq!(ins.format_version, None);
        assert_eq!(ins.checksum_ok, None);
        assert!(ins.error.is_some());
        let json = ins.to_json(Some(Target::Generic));
        assert!(json.starts_with("{\"valid\":false,\"error\":\""), "{json}");
        assert!(json.contains("\"host_verdict\":\"unsupported\""), "{json}");
    }
}
