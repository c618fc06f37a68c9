//! The attention fusion (issue #14): the exported forms fuse and compute what
//! the unfused graph does; near misses stay as they are.

use super::tests::{assert_close, data, run_f32, Builder};
use super::*;
use crate::ir::{BinaryOp, MatMulAttrs, Op, ValueId};

const B: usize = 2;
const S: usize = 5;
const H: usize = 3;
const D: usize = 4;
const E: usize = H * D;

#[derive(Clone, Copy, PartialEq)]
enum Scale {
    /// `Div(scores, √D)` (BERT).
    DivScores,
    /// `Mul(q_heads, 1/√D)` (DistilBERT-style).
    MulQ,
    /// `Div` after the mask: scales the mask too, not attention.
    AfterMask,
}

#[derive(Clone, Copy, PartialEq)]
enum Mask {
    None,
    /// `[B, 1, 1, S]`, an extended attention mask.
    Keys,
    /// `[B, 1, S, S]`.
    Full,
    /// `[B, 1, S, 1]`: broadcast along the keys, not a key mask.
    PerQuery,
}

#[derive(Clone, Copy)]
struct Form {
    scale: Scale,
    mask: Mask,
    /// K's heads as `[0,2,1,3]` read transposed by the product.
    k_trans_b: bool,
    /// K's heads as `[0,2,1,3]` then `[0,1,3,2]` (`k.transpose(2, 3)` on
    /// the heads, DistilBERT's and ViT's export before ORT merges them).
    k_twice: bool,
    dropout: bool,
    /// The heads' merge uses another perm.
    wrong_out_perm: bool,
    /// The probabilities are also a graph output.
    probs_escape: bool,
}

const BERT: Form = Form {
    scale: Scale::DivScores,
    mask: Mask::Keys,
    k_trans_b: false,
    k_twice: false,
    dropout: false,
    wrong_out_perm: false,
    probs_escape: false,
};

fn heads(b: &mut Builder, x: ValueId, perm: &[usize], name: &str) -> ValueId {
    let r = b.op_shaped(Op::Reshape, &[x], &format!("{name}_r"), Some(&[B, S, H, D]));
    b.op(Op::Transpose { perm: perm.to_vec() }, &[r], name)
}

fn projection(b: &mut Builder, x: ValueId, name: &str, seed: usize) -> ValueId {
    let w = b.constant(
        &format!("w{name}"),
        &[E, E],
        data(E * E, seed).iter().map(|v| v * 0.3).collect(),
    );
    b.op(Op::MatMul(MatMulAttrs::default()), &[x, w], name)
}

fn attention_graph(f: Form) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[B, S, E]);
    let mask = match f.mask {
        Mask::None => None,
        Mask::Keys => Some(b.input("mask", &[B, 1, 1, S])),
        Mask::Full => Some(b.input("mask", &[B, 1, S, S])),
        Mask::PerQuery => Some(b.input("mask", &[B, 1, S, 1])),
    };
    let (q, k, v) = (
        projection(&mut b, x, "q", 1),
        projection(&mut b, x, "k", 2),
        projection(&mut b, x, "v", 3),
    );
    let mut qt = heads(&mut b, q, &[0, 2, 1, 3], "qt");
    let mut kt = heads(
        &mut b,
        k,
        if f.k_trans_b || f.k_twice {
            &[0, 2, 1, 3]
        } else {
            &[0, 2, 3, 1]
        },
        "kt",
    );
    if f.k_twice {
        kt = b.op(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[kt], "kt2");
    }
    let vt = heads(&mut b, v, &[0, 2, 1, 3], "vt");
    let root = (D as f32).sqrt();
    if f.scale == Scale::MulQ {
        let c = b.scalar("inv_root", 1.0 / root);
        qt = b.bin(BinaryOp::Mul, qt, c, "q_scaled");
    }
    let qk = MatMulAttrs {
        trans_b: f.k_trans_b,
        ..MatMulAttrs::default()
    };
    let mut s = b.op(Op::MatMul(qk), &[qt, kt], "scores");
    let c = b.scalar("root", root);
    if f.scale == Scale::DivScores {
        s = b.bin(BinaryOp::Div, s, c, "scaled");
    }
    if let Some(m) = mask {
        s = b.bin(BinaryOp::Add, s, m, "masked");
    }
    if f.scale == Scale::AfterMask {
        s = b.bin(BinaryOp::Div, s, c, "scaled");
    }
    let mut p = b.op(
        Op::Softmax {
            axis: 3,
            unshifted: false,
        },
        &[s],
        "probs",
    );
    if f.probs_escape {
        b.output(p);
    }
    if f.dropout {
        p = b.op_shaped(Op::Reshape, &[p], "dropout", Some(&[B, H, S, S]));
    }
    let ctx = b.op(Op::MatMul(MatMulAttrs::default()), &[p, vt], "context");
    let perm = if f.wrong_out_perm {
        vec![0, 1, 2, 3]
    } else {
        vec![0, 2, 1, 3]
    };
    let ct = b.op(Op::Transpose { perm }, &[ctx], "merged");
    let y = b.op_shaped(Op::Reshape, &[ct], "y", Some(&[B, S, E]));
    let out = projection(&mut b, y, "out", 4);
    b.output(out);
    b.g
}

/// Inputs: x, then a mask of 0 and -10000 (every row keeps some keys).
fn inputs(g: &Graph) -> Vec<Vec<f32>> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let n = g.values[v].ty.numel();
            if k == 0 {
                data(n, 1)
            } else {
                (0..n).map(|i| if i % 3 == 2 { -10000.0 } else { 0.0 }).collect()
            }
        })
        .collect()
}

/// Compiles with `passes` on every runnable target, checks the results
/// against the graph compiled without optional passes, and returns how many
/// attentions were fused.
fn fused(g: &Graph, passes: Passes) -> usize {
    let ins = inputs(g);
    let plain = compile_with(
        g,
        Target::Generic,
        Passes {
            fold: false,
            patterns: false,
            layout: false,
            epilogue: false,
        },
    )
    .unwrap();
    let want = run_f32(&plain, &ins);
    for target in Target::ALL.into_iter().filter(|t| t.can_run_on(Target::cpu_best())) {
        let p = compile_with(g, target, passes).unwrap();
        assert_close(&run_f32(&p, &ins), &want, 2e-5);
    }
    let opt = optimise(g, passes).unwrap();
    opt.nodes.iter().filter(|n| matches!(n.op, Op::Attention(_))).count()
}

#[test]
fn exported_forms_fuse() {
    let forms = [
        BERT,
        Form {
            mask: Mask::None,
            ..BERT
        },
        Form {
            mask: Mask::Full,
            ..BERT
        },
        Form {
            scale: Scale::MulQ,
            ..BERT
        },
        Form {
            k_trans_b: true,
            ..BERT
        },
        Form { dropout: true, ..BERT },
        Form { k_twice: true, ..BERT },
    ];
    for (i, f) in forms.into_iter().enumerate() {
        let g = attention_graph(f);
        assert_eq!(fused(&g, Passes::default()), 1, "form {i}");
        // Without the epilogue pass the scale stays a Div on the scores.
        let no_epilogue = Passes {
            epilogue: false,
            ..Passes::default()
        };
        assert_eq!(fused(&g, no_epilogue), 1, "form {i} without epilogues");
    }
}

#[test]
fn the_fused_program_has_one_attention_step_and_no_transposes() {
    let p = compile(&attention_graph(BERT), Target::Generic).unwrap();
    let kinds: Vec<String> = p.steps().iter().map(|s| s.kind()).collect();
    assert_eq!(kinds.iter().filter(|k| *k == "Attention").count(), 1, "{kinds:?}");
    assert!(!kinds.iter().any(|k| k == "StridedCopy" || k == "Softmax"), "{kinds:?}");
    assert!(p.op_summary().contains("Attention+Mask x1"), "{}", p.op_summary());
}

#[test]
fn near_misses_stay_unfused() {
    let misses = [
        (
            "scale after the mask",
            Form {
                scale: Scale::AfterMask,
                ..BERT
            },
        ),
        (
            "mask along the queries",
            Form {
                mask: Mask::PerQuery,
                ..BERT
            },
        ),
        (
            "heads merged with another perm",
            Form {
                wrong_out_perm: true,
                ..BERT
            },
        ),
        (
            "probabilities read outside",
            Form {
                probs_escape: true,
                ..BERT
            },
        ),
    ];
    for (what, f) in misses {
        assert_eq!(fused(&attention_graph(f), Passes::default()), 0, "{what}");
    }
}

#[test]
fn patterns_off_leaves_attention_alone() {
    let passes = Passes {
        patterns: false,
        ..Passes::default()
    };
    assert_eq!(fused(&attention_graph(BERT), passes), 0);
}
