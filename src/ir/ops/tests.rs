//! The registry's own invariants: every op type is listed once, every
//! listed name reaches an import function written for it, and
//! `SUPPORTED_OPS` is exactly the registry's names.

use std::collections::{BTreeMap, HashSet};

use super::{families, lookup, SUPPORTED_OPS};
use crate::compiler::check_support;
use crate::ir::desc::{GraphDesc, NodeDesc, NO_CONSTANTS};

/// kiln's verdict on one `op_type` node with no inputs and output `y`.
fn verdict(domain: &str, op_type: &str, outputs: &[&str]) -> Result<(), String> {
    let node = NodeDesc {
        name: "n".into(),
        domain: domain.into(),
        op_type: op_type.into(),
        since_version: 17,
        inputs: vec![],
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        attrs: BTreeMap::new(),
    };
    let graph = GraphDesc {
        nodes: vec![node],
        ..GraphDesc::default()
    };
    check_support(&graph, &NO_CONSTANTS, &[]).remove(0)
}

#[test]
fn every_op_type_is_listed_once() {
    let mut seen = HashSet::new();
    for name in families().flat_map(|f| f.names.iter()) {
        assert!(seen.insert(*name), "{name} is in the registry twice");
    }
    let listed: HashSet<&str> = SUPPORTED_OPS.iter().copied().collect();
    assert_eq!(listed, seen);
    assert_eq!(SUPPORTED_OPS.len(), seen.len());
    assert!(SUPPORTED_OPS.windows(2).all(|w| w[0] < w[1]), "SUPPORTED_OPS is sorted");
    for must in ["MatMul", "Gemm", "Softmax", "Reshape", "Split", "Not"] {
        assert!(listed.contains(must), "{must} is missing");
    }
}

#[test]
fn every_listed_name_reaches_its_import_function() {
    for &name in SUPPORTED_OPS.iter() {
        assert!(lookup(name).is_some_and(|f| f.names.contains(&name)));
        // Without inputs every op fails, but inside its own import function.
        let why = verdict("", name, &["y"]).expect_err(name);
        assert!(!why.starts_with("kiln does not implement"), "{name}: {why}");
    }
    assert_eq!(
        verdict("", "QLinearConv", &["y"]),
        Err("kiln does not implement QLinearConv".into())
    );
    assert_eq!(
        verdict("com.microsoft", "Gelu", &["y"]),
        Err("kiln does not implement com.microsoft.Gelu".into())
    );
    assert!(lookup("relu").is_none(), "op types are case-sensitive");
}

#[test]
fn only_split_dropout_topk_and_recurrent_layers_may_use_extra_outputs() {
    let multi: HashSet<&str> = families()
        .filter(|f| f.multi_output)
        .flat_map(|f| f.names.iter().copied())
        .collect();
    // MaxPool's second output is its Indices (issue #13).
    assert_eq!(
        multi,
        HashSet::from(["Split", "Dropout", "LSTM", "GRU", "MaxPool", "TopK"])
    );
    let optional: HashSet<&str> = families()
        .filter(|f| f.optional_outputs)
        .flat_map(|f| f.names.iter().copied())
        .collect();
    assert_eq!(optional, HashSet::from(["LSTM", "GRU"]));
    // Every output of a recurrent layer is optional, but it needs one.
    assert_eq!(verdict("", "LSTM", &["", "", ""]), Err("LSTM has no output".into()));
    assert_eq!(
        verdict("", "GRU", &["", "h"]),
        Err("hidden_size 0 is not positive (or missing)".into())
    );
    assert_eq!(
        verdict("", "Relu", &["y", "z"]),
        Err("output 1 ('z') of Relu is not supported".into())
    );
    assert_eq!(verdict("", "Split", &["y", "z"]), Err("input 0 is missing".into()));
    assert_eq!(
        verdict("", "Relu", &["", "z"]).unwrap_err(),
        "output 1 ('z') of Relu is not supported"
    );
    assert_eq!(verdict("", "Relu", &[]), Err("output 0 is missing".into()));
}
