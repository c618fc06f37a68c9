//! The module layering of docs/architecture.md ("arrows point down"),
//! checked on the source text: which `crate::` modules each layer names.
//!
//! - `src/tensor/` is the leaf: it names only `crate::error` and itself, and
//!   its files do not climb out through `super` (the module is flat).
//! - `src/kernels/` knows tensors, not the IR, the compiler or the plan: it
//!   names only `crate::{error, target, tensor, kernels}`.
//! - `src/plan/` (the executable program) does not know the IR it was
//!   compiled from: it names only `crate::{error, target, tensor, kernels,
//!   plan}`.
//!
//! `crate::name!` macros count as `crate::error` (that is where kiln's
//! exported macros live).

use std::fs;
use std::path::{Path, PathBuf};

/// The first segment of every `crate::…` path in `src`, with its 1-based
/// line; `crate::{a, b::c}` gives `a` and `b`. Line comments are skipped
/// (doc text may name any module).
fn crate_paths(src: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in src.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().next_back();
            let after = &rest[at + "crate::".len()..];
            rest = after;
            // `my_crate::x` is some other path.
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = after.strip_prefix('{') {
                out.extend(group_heads(group).into_iter().map(|h| (i + 1, h)));
            } else if after[ident(after).len()..].starts_with('!') {
                // `crate::bail!`: kiln's macros are exported from error.rs.
                out.push((i + 1, "error".to_string()));
            } else {
                out.push((i + 1, ident(after)));
            }
        }
    }
    out
}

/// The first segment of each top-level item of a `{a, b::{c, d}, e}` group
/// (the text after `{`, on one line).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut at_item_start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item_start = true,
            c if at_item_start && !c.is_whitespace() => {
                heads.push(ident(&group[i..]));
                at_item_start = false;
            }
            _ => {}
        }
    }
    heads
}

fn ident(s: &str) -> String {
    s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Every `crate::` path under `src/<layer>` naming a module outside `allowed`,
/// as "file:line: crate::name".
fn violations(layer: &str, allowed: &[&str]) -> Vec<String> {
    violations_where(layer, allowed, |_| true)
}

/// [`violations`] in the files `keep` accepts.
fn violations_where(layer: &str, allowed: &[&str], keep: impl Fn(&Path) -> bool) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(layer);
    let files: Vec<PathBuf> = rust_files(&dir).into_iter().filter(|f| keep(f)).collect();
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    let mut out = Vec::new();
    for file in files {
        let src = fs::read_to_string(&file).expect("readable source");
        for (line, head) in crate_paths(&src) {
            if !allowed.contains(&head.as_str()) {
                out.push(format!("{}:{line}: crate::{head}", file.display()));
            }
        }
    }
    out
}

#[test]
fn the_checker_sees_every_form_of_path() {
    let src = "use crate::ir::Graph;\n\
               use crate::{error::Result, plan::{Weight, Storage}, tensor};\n\
               let x = crate::compiler::eval(y); // crate::ep in a comment\n\
               crate::bail!(InvalidGraph, \"no\");\n\
               // crate::ffi only in a comment\n\
               use kiln_crate::ignored;\n";
    let heads: Vec<(usize, String)> = crate_paths(src);
    let expect = [
        (1, "ir"),
        (2, "error"),
        (2, "plan"),
        (2, "tensor"),
        (3, "compiler"),
        (4, "error"),
    ];
    let expect: Vec<(usize, String)> = expect.iter().map(|&(l, h)| (l, h.to_string())).collect();
    assert_eq!(heads, expect);
}

#[test]
fn tensor_is_a_leaf() {
    let bad = violations("tensor", &["error", "tensor"]);
    assert!(
        bad.is_empty(),
        "src/tensor/ must import only crate::error:\n{}",
        bad.join("\n")
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tensor");
    for file in rust_files(&dir) {
        let src = fs::read_to_string(&file).expect("readable source");
        // mod.rs is the module itself: its `super` is the crate root.
        let climbs = if file.ends_with("mod.rs") {
            "super::"
        } else {
            "super::super"
        };
        assert!(
            !src.contains(climbs),
            "{} climbs out of src/tensor/ through {climbs}",
            file.display()
        );
    }
}

#[test]
fn kernels_know_tensors_not_the_ir_or_the_plan() {
    let bad = violations("kernels", &["error", "target", "tensor", "kernels"]);
    assert!(
        bad.is_empty(),
        "src/kernels/ imports from above it:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_plan_does_not_know_the_ir() {
    let bad = violations("plan", &["error", "target", "tensor", "kernels", "plan"]);
    assert!(bad.is_empty(), "src/plan/ imports from above it:\n{}", bad.join("\n"));
}

#[test]
fn the_ir_does_not_know_the_compiler() {
    // Its unit tests compile what they import, so they may.
    let not_a_test = |f: &Path| !f.components().any(|c| c.as_os_str() == "tests") && !f.ends_with("tests.rs");
    let bad = violations_where(
        "ir",
        &["error", "target", "tensor", "kernels", "plan", "ir"],
        not_a_test,
    );
    assert!(bad.is_empty(), "src/ir/ imports from above it:\n{}", bad.join("\n"));
}
