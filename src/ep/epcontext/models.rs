//! Just enough of the ONNX model format to read which context binary files a
//! compiled model (`_ctx.onnx`) names: its top-level `EPContext` nodes with
//! `embed_mode=0`. A writer uses it to check that ONNX Runtime really wrote
//! the model its binary belongs to before putting the binary in place, and
//! that no other compiled model still uses a binary it would replace.
//!
//! Fields this reader does not declare (initializers, tensors, subgraphs)
//! are skipped by prost without being copied.

use prost::Message;

use super::schema::{EMBED_MODE, EP_CACHE_CONTEXT, EP_CONTEXT_DOMAIN, EP_CONTEXT_OP, NOTES, SOURCE};

/// The model is not an ONNX model this reader can decode.
#[derive(Debug)]
pub struct OnnxModelError(pub String);

impl std::fmt::Display for OnnxModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeProto {
    #[prost(string, tag = "4")]
    op_type: String,
    #[prost(message, repeated, tag = "5")]
    attribute: Vec<AttributeProto>,
    #[prost(string, tag = "7")]
    domain: String,
}

#[derive(Clone, PartialEq, Message)]
struct AttributeProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int64, tag = "3")]
    i: i64,
    #[prost(bytes = "vec", tag = "4")]
    s: Vec<u8>,
}

/// What a compiled model's main kiln EPContext node records about the file
/// it names, in its `notes`: the binary's checksum. Content-derived, so a
/// model written by an identical compile carries the same stamp.
pub fn binary_stamp(checksum: u128) -> String {
    format!("binary checksum {checksum:032x}")
}

/// The checksum a [`binary_stamp`] in `notes` records, if any.
pub fn stamped_checksum(notes: &str) -> Option<u128> {
    let (_, rest) = notes.rsplit_once("binary checksum ")?;
    let hex = rest.get(..32)?;
    u128::from_str_radix(hex, 16).ok()
}

/// Whether `model` (the bytes of an ONNX model) has an EPContext node from
/// `is_source` whose `ep_cache_context` is the file `bin_name`, and, with
/// `checksum`, whose `notes` carry that checksum's [`binary_stamp`].
pub fn names_binary(
    model: &[u8],
    is_source: impl Fn(&str) -> bool,
    bin_name: &str,
    checksum: Option<u128>,
) -> Result<bool, OnnxModelError> {
    let model = ModelProto::decode(model).map_err(|e| OnnxModelError(format!("not an ONNX model: {e}")))?;
    let nodes = model.graph.map(|g| g.node).unwrap_or_default();
    let stamp = checksum.map(binary_stamp);
    Ok(nodes.iter().any(|n| {
        let attr = |name: &str| n.attribute.iter().find(|a| a.name == name);
        let text = |name: &str| attr(name).map(|a| String::from_utf8_lossy(&a.s).into_owned());
        n.op_type == EP_CONTEXT_OP
            && n.domain == EP_CONTEXT_DOMAIN
            && text(SOURCE).is_some_and(|s| is_source(&s))
            && attr(EMBED_MODE).is_some_and(|a| a.i == 0)
            && attr(EP_CACHE_CONTEXT).is_some_and(|a| a.s == bin_name.as_bytes())
            && stamp
                .as_deref()
                .is_none_or(|s| text(NOTES).is_some_and(|n| n.contains(s)))
    }))
}

/// For tests elsewhere: an ONNX model whose one EPContext node, from
/// `source`, names the file `bin_name` (embed mode 0).
#[cfg(test)]
pub fn model_naming(source: &str, bin_name: &str) -> Vec<u8> {
    let attr = |name: &str, i: i64, s: &str| AttributeProto {
        name: name.into(),
        i,
        s: s.as_bytes().to_vec(),
    };
    ModelProto {
        graph: Some(GraphProto {
            node: vec![NodeProto {
                op_type: EP_CONTEXT_OP.into(),
                domain: EP_CONTEXT_DOMAIN.into(),
                attribute: vec![
                    attr(SOURCE, 0, source),
                    attr(EMBED_MODE, 0, ""),
                    attr(EP_CACHE_CONTEXT, 0, bin_name),
                ],
            }],
        }),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(attrs: Vec<AttributeProto>, op: &str) -> Vec<u8> {
        ModelProto {
            graph: Some(GraphProto {
                node: vec![NodeProto {
                    op_type: op.into(),
                    attribute: attrs,
                    domain: "com.microsoft".into(),
                }],
            }),
        }
        .encode_to_vec()
    }

    fn text(name: &str, v: &str) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            i: 0,
            s: v.as_bytes().to_vec(),
        }
    }

    fn int(name: &str, v: i64) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            i: v,
            s: vec![],
        }
    }

    #[test]
    fn stamps_read_back() {
        let notes = format!("Add x1; 2 steps; {}", binary_stamp(0xabc));
        assert_eq!(stamped_checksum(&notes), Some(0xabc));
        assert_eq!(stamped_checksum("Add x1; 2 steps"), None);
        assert_eq!(stamped_checksum("binary checksum 12"), None, "too short");
    }

    #[test]
    fn finds_the_file_and_the_stamp() {
        let kiln = |s: &str| s == "kiln";
        let notes = format!("ops; {}", binary_stamp(7));
        let m = model(
            vec![
                text("source", "kiln"),
                int("embed_mode", 0),
                text("ep_cache_context", "m_kiln.bin"),
                text("notes", &notes),
            ],
            "EPContext",
        );
        assert!(names_binary(&m, kiln, "m_kiln.bin", None).unwrap());
        assert!(names_binary(&m, kiln, "m_kiln.bin", Some(7)).unwrap());
        assert!(
            !names_binary(&m, kiln, "m_kiln.bin", Some(8)).unwrap(),
            "another checksum"
        );
        assert!(!names_binary(&m, kiln, "x_kiln.bin", None).unwrap(), "another file");
        assert!(
            !names_binary(&m, |s| s == "other", "m_kiln.bin", None).unwrap(),
            "another EP"
        );
        let embedded = model(
            vec![
                text("source", "kiln"),
                int("embed_mode", 1),
                text("ep_cache_context", "m_kiln.bin"),
            ],
            "EPContext",
        );
        assert!(!names_binary(&embedded, kiln, "m_kiln.bin", None).unwrap());
        let other_op = model(
            vec![text("source", "kiln"), text("ep_cache_context", "m_kiln.bin")],
            "Relu",
        );
        assert!(!names_binary(&other_op, kiln, "m_kiln.bin", None).unwrap());
        // a model cut short is not a model that names the file
        assert!(names_binary(&m[..m.len() - 3], kiln, "m_kiln.bin", Some(7)).map_or(true, |named| !named));
        assert!(names_binary(b"\xff\xff\xff", kiln, "m_kiln.bin", None).is_err());
    }
}
