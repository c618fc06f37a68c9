//! `proto.rs` is the schema; `docs/context-format.md` shows it in `.proto`
//! syntax for readers. This test reads both texts and fails on any
//! difference in messages, fields (label, type, name, number), oneof members
//! or enum values, so the document cannot drift from the code.

use std::collections::BTreeMap;

/// A message's fields by number: (label, type, name); or an enum's values.
#[derive(Debug, PartialEq)]
enum Item {
    Message(BTreeMap<u32, (String, String, String)>),
    Enum(BTreeMap<i64, String>),
}

type Schema = BTreeMap<String, Item>;

// ---- proto.rs ----

/// `MatMul` -> `mat_mul`.
fn snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn quoted_after<'a>(attr: &'a str, key: &str) -> Option<&'a str> {
    let rest = &attr[attr.find(key)? + key.len()..];
    let rest = rest.trim_start().strip_prefix('=')?.trim_start().strip_prefix('"')?;
    Some(&rest[..rest.find('"')?])
}

/// The type a Rust field type names: `Vec<super::BufInfo>` -> `BufInfo`.
fn inner_type(rust: &str) -> String {
    let mut t = rust.trim().trim_end_matches(',');
    for wrapper in ["Option<", "Vec<"] {
        if let Some(inner) = t.strip_prefix(wrapper) {
            t = inner.strip_suffix('>').unwrap_or(inner);
        }
    }
    t.trim_start_matches("super::").to_string()
}

/// (label, type) of a field from its `#[prost(...)]` arguments and Rust type.
fn field_type(attr: &str, rust_type: &str) -> (String, String) {
    let kind = attr.split([',', ' ']).next().unwrap_or_default();
    let ty = match kind {
        "message" => inner_type(rust_type),
        "enumeration" => quoted_after(attr, "enumeration").unwrap_or_default().to_string(),
        other => other.to_string(),
    };
    let label = if attr.contains("repeated") {
        "repeated"
    } else if attr.contains("optional") && kind != "message" {
        "optional"
    } else {
        ""
    };
    (label.to_string(), ty)
}

/// Trimmed lines, with a `#[prost(...)]` that rustfmt wrapped over several
/// lines (a long oneof `tags` list) joined back into one.
fn joined_attributes(src: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for line in src.lines().map(str::trim) {
        if open {
            let last = out.last_mut().expect("an open attribute");
            if !last.ends_with('(') && line != ")]" {
                last.push(' ');
            }
            last.push_str(line);
            open = !line.ends_with(")]");
            continue;
        }
        open = line.starts_with("#[prost(") && !line.ends_with(")]");
        out.push(line.to_string());
    }
    out
}

fn rust_schema(src: &str) -> Schema {
    let mut schema = Schema::new();
    // oneof enums: module name -> members (tag, type, name)
    let mut oneofs: BTreeMap<String, Vec<(u32, String, String)>> = BTreeMap::new();
    // messages' oneof fields: message -> module names, resolved at the end
    let mut uses: Vec<(String, String)> = Vec::new();
    let (mut current, mut module, mut attr): (Option<(String, bool)>, Option<String>, Option<String>) =
        (None, None, None);
    let mut is_enum = false;
    for line in joined_attributes(src).iter().map(String::as_str) {
        if line.starts_with("///") || line.starts_with("//") || line.is_empty() {
            continue;
        }
        if let Some(derive) = line.strip_prefix("#[derive(") {
            is_enum = derive.contains("prost::Enumeration");
            continue;
        }
        if let Some(a) = line.strip_prefix("#[prost(") {
            attr = Some(a.trim_end_matches(")]").to_string());
            continue;
        }
        if let Some(m) = line.strip_prefix("pub mod ") {
            module = Some(m.trim_end_matches(" {").to_string());
            continue;
        }
        if let Some(name) = line.strip_prefix("pub struct ") {
            let name = name.trim_end_matches(" {}").trim_end_matches(" {").to_string();
            schema.insert(name.clone(), Item::Message(BTreeMap::new()));
            current = Some((name, false));
            continue;
        }
        if let Some(name) = line.strip_prefix("pub enum ") {
            let name = name.trim_end_matches(" {").to_string();
            if let Some(m) = &module {
                oneofs.entry(m.clone()).or_default();
                current = Some((m.clone(), true));
            } else {
                assert!(is_enum, "enum {name} is not a prost enumeration");
                schema.insert(name.clone(), Item::Enum(BTreeMap::new()));
                current = Some((name, false));
            }
            continue;
        }
        if line == "}" {
            // Closes a struct or enum, else the module of a oneof.
            if current.take().is_none() {
                module = None;
            }
            continue;
        }
        let Some((owner, oneof)) = current.clone() else {
            continue;
        };
        if oneof {
            // `Unary(super::UnaryStep),` after `#[prost(message, tag = "1")]`
            let a = attr.take().expect("a oneof member has a #[prost] attribute");
            let (variant, ty) = line.split_once('(').expect("a oneof member holds a value");
            let tag = quoted_after(&a, "tag").expect("tag").parse().unwrap();
            let (_, ty) = field_type(&a, ty.trim_end_matches("),"));
            oneofs.get_mut(&owner).unwrap().push((tag, ty, snake(variant)));
            continue;
        }
        match schema.get_mut(&owner) {
            Some(Item::Enum(values)) => {
                // `Relu = 1,`
                let (variant, n) = line.trim_end_matches(',').split_once(" = ").expect("enum value");
                values.insert(n.parse().unwrap(), snake(variant).to_uppercase());
            }
            Some(Item::Message(fields)) => {
                let a = attr.take().expect("a field has a #[prost] attribute");
                let (name, ty) = line
                    .strip_prefix("pub ")
                    .and_then(|l| l.split_once(": "))
                    .expect("a field");
                if let Some(m) = quoted_after(&a, "oneof") {
                    uses.push((owner.clone(), m.split("::").next().unwrap().to_string()));
                    continue;
                }
                let tag = quoted_after(&a, "tag").expect("tag").parse().unwrap();
                let (label, ty) = field_type(&a, ty);
                fields.insert(tag, (label, ty, name.to_string()));
            }
            None => unreachable!(),
        }
    }
    for (message, module) in uses {
        let Some(Item::Message(fields)) = schema.get_mut(&message) else {
            unreachable!()
        };
        for (tag, ty, name) in &oneofs[&module] {
            fields.insert(*tag, (String::new(), ty.clone(), name.clone()));
        }
    }
    schema
}

// ---- the .proto block of the document ----

fn tokens(proto: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in proto.lines() {
        let code = line.split("//").next().unwrap();
        let mut word = String::new();
        for c in code.chars() {
            if c.is_alphanumeric() || c == '_' {
                word.push(c);
                continue;
            }
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            if "{};=".contains(c) {
                out.push(c.to_string());
            }
        }
        if !word.is_empty() {
            out.push(word);
        }
    }
    out
}

fn doc_schema(proto: &str) -> Schema {
    let t = tokens(proto);
    let mut schema = Schema::new();
    let mut i = 0;
    let expect = |i: &mut usize, what: &str| {
        assert_eq!(
            t[*i],
            what,
            "expected '{what}' at token {i} ({:?})",
            &t[*i..(*i + 8).min(t.len())]
        );
        *i += 1;
    };
    while i < t.len() {
        let kind = t[i].clone();
        let name = t[i + 1].clone();
        i += 2;
        expect(&mut i, "{");
        let item = match kind.as_str() {
            "message" => {
                let mut fields = BTreeMap::new();
                let mut depth = 1;
                while depth > 0 {
                    match t[i].as_str() {
                        "}" => {
                            depth -= 1;
                            i += 1;
                        }
                        "oneof" => {
                            i += 2;
                            expect(&mut i, "{");
                            depth += 1;
                        }
                        _ => {
                            let label = match t[i].as_str() {
                                "repeated" | "optional" => {
                                    i += 1;
                                    t[i - 1].clone()
                                }
                                _ => String::new(),
                            };
                            let (ty, field) = (t[i].clone(), t[i + 1].clone());
                            i += 2;
                            expect(&mut i, "=");
                            let n: u32 = t[i].parse().expect("a field number");
                            i += 1;
                            expect(&mut i, ";");
                            assert!(
                                fields.insert(n, (label, ty, field)).is_none(),
                                "{name}: number {n} twice"
                            );
                        }
                    }
                }
                Item::Message(fields)
            }
            "enum" => {
                let mut values = BTreeMap::new();
                while t[i] != "}" {
                    let v = t[i].clone();
                    i += 1;
                    expect(&mut i, "=");
                    values.insert(t[i].parse().expect("an enum number"), v);
                    i += 1;
                    expect(&mut i, ";");
                }
                i += 1;
                Item::Enum(values)
            }
            other => panic!("unexpected '{other}' in the document's proto block"),
        };
        assert!(schema.insert(name.clone(), item).is_none(), "{name} defined twice");
    }
    schema
}

fn doc_proto_block(md: &str) -> &str {
    let start = md.find("```proto\n").expect("a ```proto block") + "```proto\n".len();
    let len = md[start..].find("```").expect("the block's end");
    &md[start..start + len]
}

#[test]
fn the_documented_schema_is_proto_rs() {
    let code = rust_schema(include_str!("proto.rs"));
    let doc = doc_schema(doc_proto_block(include_str!("../../docs/context-format.md")));
    assert!(code.len() > 30, "proto.rs parsed to {} items", code.len());
    let names = |s: &Schema| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&doc),
        names(&code),
        "messages and enums of docs/context-format.md vs proto.rs"
    );
    for (name, item) in &code {
        assert_eq!(&doc[name], item, "{name}: docs/context-format.md vs proto.rs");
    }
}

#[test]
fn the_readers_see_what_they_should() {
    // The parsers themselves: a known message, oneof and enum of each text.
    let code = rust_schema(include_str!("proto.rs"));
    let Item::Message(m) = &code["MatMulStep"] else {
        panic!()
    };
    assert_eq!(m[&8], ("optional".into(), "uint64".into(), "packed_b".into()));
    assert_eq!(m[&11], ("".into(), "BiasKindInfo".into(), "bias_kind".into()));
    let Item::Message(s) = &code["StepInfo"] else { panic!() };
    assert_eq!(s[&4], ("".into(), "MatMulStep".into(), "mat_mul".into()));
    let Item::Enum(e) = &code["ActivationKind"] else {
        panic!()
    };
    assert_eq!(e[&10], "GELU_TANH_WRITTEN");
    let doc = doc_schema("message A { repeated uint64 x = 3; oneof k { B b = 1; } } // c\nenum E { Z = 0; }");
    let Item::Message(a) = &doc["A"] else { panic!() };
    assert_eq!(a[&3], ("repeated".into(), "uint64".into(), "x".into()));
    assert_eq!(a[&1], ("".into(), "B".into(), "b".into()));
    assert_eq!(doc["E"], Item::Enum([(0, "Z".to_string())].into()));
}
