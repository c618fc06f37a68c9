//! Q, K and V's projections as one product (`compiler::qkv`, issue #14):
//! the merge fires on a self-attention whose three projections qualify,
//! computes exactly what the three products did, and leaves near misses.

use super::tests::{data, run_f32, Builder};
use super::*;
use crate::ir::{Activation, AttentionAttrs, BiasKind, MatMulAttrs, Op, ValueId};

const B: usize = 2;
const S: usize = 5;
const H: usize = 4;

/// How one graph differs from the mergeable self-attention.
#[derive(Clone, Copy, Default)]
struct Miss {
    /// Q, K and V this wide (64 merges: a multiple of every panel width).
    width: Option<usize>,
    /// K and V project another input (cross-attention).
    cross: bool,
    /// Q is also a graph output.
    q_escapes: bool,
    /// V's product has a Relu after its bias.
    v_activation: bool,
    /// Only Q's product has a bias.
    q_bias_only: bool,
    /// K's product scales by 0.5.
    k_alpha: bool,
    /// No biases at all (still mergeable).
    no_bias: bool,
    /// A mask input `[B, 1, 1, S]` (still mergeable).
    mask: bool,
}

fn projection(b: &mut Builder, x: ValueId, name: &str, seed: usize, width: usize, attrs: MatMulAttrs) -> ValueId {
    let e = b.g.values[x].ty.shape[2];
    let w = b.constant(
        &format!("w{name}"),
        &[e, width],
        data(e * width, seed).iter().map(|v| v * 0.3).collect(),
    );
    let mut ins = vec![x, w];
    if attrs.bias == BiasKind::Row {
        ins.push(b.constant(&format!("b{name}"), &[width], data(width, seed + 10)));
    }
    b.op(Op::MatMul(attrs), &ins, name)
}

/// A self-attention, already fused (what `compiler::attention` leaves), between
/// its projections and an output projection.
fn graph(m: Miss) -> Graph {
    let width = m.width.unwrap_or(64);
    let mut b = Builder::new();
    let x = b.input("x", &[B, S, width]);
    let kv_in = if m.cross { b.input("memory", &[B, S, width]) } else { x };
    let mask = m.mask.then(|| b.input("mask", &[B, 1, 1, S]));
    let bias = |on: bool| if on { BiasKind::Row } else { BiasKind::None };
    let plain = MatMulAttrs {
        bias: bias(!m.no_bias),
        ..MatMulAttrs::default()
    };
    let k_attrs = MatMulAttrs {
        alpha: if m.k_alpha { 0.5 } else { 1.0 },
        bias: bias(!m.no_bias && !m.q_bias_only),
        ..plain
    };
    let v_attrs = MatMulAttrs {
        activation: if m.v_activation {
            Activation::Relu
        } else {
            Activation::None
        },
        ..k_attrs
    };
    let q = projection(&mut b, x, "q", 1, width, plain);
    let k = projection(
        &mut b,
        kv_in,
        "k",
        2,
        width,
        MatMulAttrs {
            alpha: k_attrs.alpha,
            ..k_attrs
        },
    );
    let v = projection(&mut b, kv_in, "v", 3, width, MatMulAttrs { alpha: 1.0, ..v_attrs });
    if m.q_escapes {
        b.output(q);
    }
    let mut ins = vec![q, k, v];
    ins.extend(mask);
    let attrs = AttentionAttrs {
        heads: H,
        scale: 0.25,
        mask: m.mask,
        packed_qkv: false,
    };
    let y = b.op(Op::Attention(attrs), &ins, "y");
    let out = projection(&mut b, y, "out", 4, width, MatMulAttrs::default());
    b.output(out);
    b.g
}

fn inputs(g: &Graph) -> Vec<Vec<f32>> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let n = g.values[v].ty.numel();
            if g.values[v].name == "mask" {
                (0..n).map(|j| if j % 4 == 3 { -10000.0 } else { 0.0 }).collect()
            } else {
                data(n, 5 + i)
            }
        })
        .collect()
}

/// Merged products after the passes; checks that every runnable target
/// computes, bit for bit, what it computes without the merge.
fn merged(g: &Graph) -> usize {
    let ins = inputs(g);
    let unmerged = Passes {
        patterns: false,
        ..Passes::default()
    };
    for target in Target::ALL.into_iter().filter(|t| t.can_run_on(Target::cpu_best())) {
        let want = run_f32(&compile_with(g, target, unmerged).unwrap(), &ins);
        let got = run_f32(&compile(g, target).unwrap(), &ins);
        assert_eq!(got, want, "{target}");
    }
    let opt = optimise(g, Passes::default()).unwrap();
    opt.validate().unwrap();
    let products = opt
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::MatMul(m) if m.b_parts == 3))
        .count();
    let packed = opt
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Attention(a) if a.packed_qkv))
        .count();
    assert_eq!(products, packed, "each merged product feeds a packed attention");
    products
}

#[test]
fn self_attention_projections_merge_with_or_without_bias_and_mask() {
    for m in [
        Miss::default(),
        Miss {
            no_bias: true,
            ..Miss::default()
        },
        Miss {
            mask: true,
            ..Miss::default()
        },
        Miss {
            width: Some(96),
            mask: true,
            ..Miss::default()
        },
    ] {
        assert_eq!(merged(&graph(m)), 1);
    }
}

#[test]
fn the_merged_program_packs_each_weight_once_and_reads_them_as_parts() {
    let p = compile(&graph(Miss::default()), Target::Generic).unwrap();
    let summary = p.op_summary();
    assert!(summary.contains("MatMul(3 weights)+Bias x1"), "{summary}");
    assert!(summary.contains("Attention(QKV) x1"), "{summary}");
    let parts = p
        .steps()
        .iter()
        .filter(|s| matches!(s, crate::plan::Step::MatMul(m) if matches!(m.b, crate::plan::MatB::PackedParts(_))))
        .count();
    assert_eq!(parts, 1);
    // Wq, Wk, Wv and the output projection's weight, each packed once.
    assert_eq!(p.packed_constants(), 4);
}

#[test]
fn near_misses_keep_three_products() {
    let misses = [
        Miss {
            width: Some(48),
            ..Miss::default()
        },
        Miss {
            cross: true,
            ..Miss::default()
        },
        Miss {
            q_escapes: true,
            ..Miss::default()
        },
        Miss {
            v_activation: true,
            ..Miss::default()
        },
        Miss {
            q_bias_only: true,
            ..Miss::default()
        },
        Miss {
            k_alpha: true,
            ..Miss::default()
        },
    ];
    for (i, m) in misses.into_iter().enumerate() {
        assert_eq!(merged(&graph(m)), 0, "near miss {i}");
    }
}
