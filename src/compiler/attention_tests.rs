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
    /// PyTorch's SDPA export: `Mul(q_heads, √c)` and `Mul(kᵀ_heads, √c)`
    /// with `c = 1/√D`.
    Sdpa,
    /// [`Scale::Sdpa`] with V's heads scaled too: that scales the output.
    SdpaAndV,
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
    /// DistilBERT's masked fill: `Where(Expand(Reshape(Equal(m, 0),
    /// [B,1,1,S]), [B,H,S,S]), fill, scores)` for an input `m` `[B, S]`
    /// (`keep`: `Where(cond, scores, fill)`).
    Fill {
        value: f32,
        keep: bool,
    },
}

const DISTILBERT_MASK: Mask = Mask::Fill {
    value: f32::MIN,
    keep: false,
};

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

/// DistilBERT's export: `q / √D` on the heads, `k.transpose(2, 3)` on the
/// heads, the padding filled with `finfo(f32).min`.
const DISTILBERT: Form = Form {
    scale: Scale::MulQ,
    mask: DISTILBERT_MASK,
    k_twice: true,
    ..BERT
};

/// PyTorch's `scaled_dot_product_attention` export with HF's float mask.
const SDPA: Form = Form {
    scale: Scale::Sdpa,
    mask: Mask::Full,
    k_twice: true,
    ..BERT
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

/// The scores `s` masked as `f.mask` says (`m` the mask input).
fn masked(b: &mut Builder, f: Form, s: ValueId, m: Option<ValueId>) -> ValueId {
    let Some(m) = m else { return s };
    let Mask::Fill { value, keep } = f.mask else {
        return b.bin(BinaryOp::Add, s, m, "masked");
    };
    let zero = b.scalar("zero", 0.0);
    let pad = b.bin(BinaryOp::Equal, m, zero, "pad");
    let pad = b.op_shaped(Op::Reshape, &[pad], "pad_keys", Some(&[B, 1, 1, S]));
    let cond = b.op_shaped(Op::Expand, &[pad], "pad_scores", Some(&[B, H, S, S]));
    let fill = b.scalar("fill", value);
    let ins = if keep { [cond, s, fill] } else { [cond, fill, s] };
    b.op(Op::Where, &ins, "masked")
}

fn attention_graph(f: Form) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[B, S, E]);
    let mask = match f.mask {
        Mask::None => None,
        Mask::Keys => Some(b.input("mask", &[B, 1, 1, S])),
        Mask::Full => Some(b.input("mask", &[B, 1, S, S])),
        Mask::PerQuery => Some(b.input("mask", &[B, 1, S, 1])),
        Mask::Fill { .. } => Some(b.input("mask", &[B, S])),
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
    let mut vt = heads(&mut b, v, &[0, 2, 1, 3], "vt");
    let root = (D as f32).sqrt();
    if f.scale == Scale::MulQ {
        let c = b.scalar("inv_root", 1.0 / root);
        qt = b.bin(BinaryOp::Mul, qt, c, "q_scaled");
    }
    if matches!(f.scale, Scale::Sdpa | Scale::SdpaAndV) {
        let c = b.scalar("sqrt_scale", (1.0 / root).sqrt());
        qt = b.bin(BinaryOp::Mul, qt, c, "q_scaled");
        kt = b.bin(BinaryOp::Mul, kt, c, "k_scaled");
        if f.scale == Scale::SdpaAndV {
            vt = b.bin(BinaryOp::Mul, vt, c, "v_scaled");
        }
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
    s = masked(&mut b, f, s, mask);
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

/// Inputs: x, then a mask of 0 and -10000 (every row keeps some keys; a
/// masked fill pads where it is 0).
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
    fused_on(g, passes, &inputs(g))
}

/// [`fused`] on the inputs `ins`.
fn fused_on(g: &Graph, passes: Passes, ins: &[Vec<f32>]) -> usize {
    let plain = compile_with(
        g,
        Target::Generic,
        Passes {
            fold: false,
            patterns: false,
            layout: false,
            epilogue: false,
            chain: false,
            winograd: true,
        },
    )
    .unwrap();
    let want = run_f32(&plain, ins);
    for target in Target::ALL.into_iter().filter(|t| t.can_run_on(Target::cpu_best())) {
        let p = compile_with(g, target, passes).unwrap();
        assert_close(&run_f32(&p, ins), &want, 2e-5);
    }
    let opt = optimise(g, passes).unwrap();
    opt.validate().unwrap();
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
        DISTILBERT,
        Form {
            mask: Mask::Fill {
                value: f32::NEG_INFINITY,
                keep: false,
            },
            ..DISTILBERT
        },
        Form {
            mask: Mask::Fill {
                value: f32::MIN,
                keep: true,
            },
            ..DISTILBERT
        },
        Form {
            mask: Mask::None,
            ..DISTILBERT
        },
        SDPA,
        Form {
            mask: Mask::Keys,
            ..SDPA
        },
        Form {
            mask: Mask::None,
            ..SDPA
        },
        // ViT: BERT's form with K transposed twice, no mask.
        Form {
            mask: Mask::None,
            k_twice: true,
            ..BERT
        },
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
        (
            "a fill the sum does not absorb",
            Form {
                mask: Mask::Fill {
                    value: -10000.0,
                    keep: false,
                },
                ..DISTILBERT
            },
        ),
        (
            "scale after the masked fill",
            Form {
                scale: Scale::AfterMask,
                ..DISTILBERT
            },
        ),
        (
            "V's heads scaled",
            Form {
                scale: Scale::SdpaAndV,
                ..SDPA
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

#[test]
fn masked_fill_becomes_an_additive_mask_of_the_unexpanded_shape() {
    let opt = optimise(&attention_graph(DISTILBERT), Passes::default()).unwrap();
    let at = opt.nodes.iter().position(|n| matches!(n.op, Op::Attention(_))).unwrap();
    let mask = opt.nodes[at].inputs[3];
    assert_eq!(opt.values[mask].ty, crate::ir::TensorType::f32(&[B, 1, 1, S]));
    let (i, n) = opt.nodes.iter().enumerate().find(|(_, n)| n.outputs == [mask]).unwrap();
    assert!(n.op == Op::Where && i < at, "{:?}", n.op);
    assert!(!opt.nodes.iter().any(|n| n.op == Op::Expand));
}

/// Every key padded: `f32::MIN` gives uniform weights, `-inf` NaN, with and
/// without the fusion, filled (DistilBERT) or added (RoBERTa's extended mask
/// `(1 - m) · finfo.min`).
#[test]
fn fully_masked_rows_match_the_unfused_graph() {
    for value in [f32::MIN, f32::NEG_INFINITY] {
        for keep in [false, true] {
            let g = attention_graph(Form {
                mask: Mask::Fill { value, keep },
                ..DISTILBERT
            });
            let mut ins = inputs(&g);
            // keep: `Where(pad, s, fill)` keeps the scores where the input is
            // 0, so 1 everywhere masks every key.
            ins[1].fill(if keep { 1.0 } else { 0.0 });
            assert_fully_masked(&g, &ins, value);
        }
        let g = attention_graph(BERT);
        let mut ins = inputs(&g);
        ins[1].fill(value);
        assert_fully_masked(&g, &ins, value);
    }
}

/// `g` fuses and computes what it does unfused on `ins`, all NaN iff the
/// mask is `-inf`.
fn assert_fully_masked(g: &Graph, ins: &[Vec<f32>], value: f32) {
    assert_eq!(fused_on(g, Passes::default(), ins), 1, "{value}");
    let out = run_f32(&compile(g, Target::Generic).unwrap(), ins);
    assert_eq!(out[0].iter().all(|x| x.is_nan()), value == f32::NEG_INFINITY, "{value}");
    assert!(out[0].iter().all(|x| x.is_nan()) || out[0].iter().all(|x| x.is_finite()));
}
