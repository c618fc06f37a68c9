//! Embeddings + LayerNorm as one op (`compiler::embed`, issue #14): the
//! fusion fires on a BERT embedding layer, computes bit for bit what the
//! gathers, adds and norm did (and what a reference computes), refuses a bad
//! index as the gather did, and leaves near misses.

use super::tests::{data, Builder};
use super::*;
use crate::error::ErrorKind;
use crate::ir::{BinaryOp, DType, EmbedTerm, Op, Tensor, TensorType, UnaryOp, ValueId};
use crate::kernels::parallel::{Parallel, ScopedThreads, Serial};
use crate::plan::{TensorMut, TensorRef};

const B: usize = 2;
const S: usize = 5;
const W: usize = 24;
const VOCAB: usize = 30;

/// How one graph differs from the BERT embedding layer.
#[derive(Clone, Copy, Default)]
struct Miss {
    /// The embeddings' sum is also a graph output.
    sum_escapes: bool,
    /// The word gather is also a graph output (still fused, that term added).
    word_escapes: bool,
    /// The norm covers the last two axes.
    two_axes: bool,
    /// A `[B, S, 1]` input is added too (broadcast along the width).
    narrow_term: bool,
    /// No bias on the norm (still fused).
    no_bias: bool,
    /// A Relu of a `[B, S, W]` input is added too (still fused, added as it is).
    made_term: bool,
}

fn index_input(b: &mut Builder, name: &str, dtype: DType) -> ValueId {
    let v = b.g.add_value(name, TensorType::new(dtype, &[B, S])).unwrap();
    b.g.inputs.push(v);
    v
}

/// `LayerNorm((word[ids] + segment[types]) + position[0..S])`, then a Relu.
fn graph(m: Miss) -> Graph {
    let mut b = Builder::new();
    let ids = index_input(&mut b, "ids", DType::I64);
    let types = index_input(&mut b, "types", DType::I32);
    let word = b.constant("word", &[VOCAB, W], data(VOCAB * W, 1));
    let segment = b.constant("segment", &[2, W], data(2 * W, 2));
    let position = b.constant("position", &[8, W], data(8 * W, 3));
    let pos_ids = b.g.add_value("pos_ids", TensorType::new(DType::I64, &[1, S])).unwrap();
    let positions: Vec<i64> = (0..S as i64).collect();
    b.g.add_constant_tensor(pos_ids, &Tensor::i64(&[1, S], positions))
        .unwrap();
    let gather = Op::Gather { axis: 0 };
    let w = b.op(gather.clone(), &[word, ids], "w");
    let s = b.op(gather.clone(), &[segment, types], "s");
    let p = b.op(gather, &[position, pos_ids], "p");
    let ws = b.bin(BinaryOp::Add, w, s, "ws");
    let mut x = b.bin(BinaryOp::Add, p, ws, "x");
    if m.narrow_term {
        let n = b.input("narrow", &[B, S, 1]);
        x = b.bin(BinaryOp::Add, x, n, "xn");
    }
    if m.made_term {
        let e = b.input("extra", &[B, S, W]);
        let r = b.un(UnaryOp::Relu, e, "relu");
        x = b.bin(BinaryOp::Add, r, x, "xr");
    }
    let norm = if m.two_axes { vec![S, W] } else { vec![W] };
    let numel = norm.iter().product();
    let mut ins = vec![x, b.constant("gamma", &norm, data(numel, 4))];
    if !m.no_bias {
        ins.push(b.constant("beta", &norm, data(numel, 5)));
    }
    let ln = Op::LayerNorm {
        axis: if m.two_axes { 1 } else { 2 },
        epsilon: 1e-12,
        decomposed: false,
    };
    let y = b.op(ln, &ins, "y");
    let out = b.un(UnaryOp::Relu, y, "out");
    b.output(out);
    if m.sum_escapes {
        b.output(x);
    }
    if m.word_escapes {
        b.output(w);
    }
    b.g
}

/// Word ids (one negative: counted from the end) and segment ids.
fn index_data(bad: Option<i64>) -> (Vec<i64>, Vec<i32>) {
    let mut ids: Vec<i64> = (0..B * S).map(|i| (i * 7 % VOCAB) as i64).collect();
    ids[3] = -1;
    if let Some(bad) = bad {
        ids[B * S - 1] = bad;
    }
    let types = (0..B * S).map(|i| (i % 3 == 0) as i32).collect();
    (ids, types)
}

fn run(p: &Program, bad: Option<i64>, par: &dyn Parallel) -> crate::error::Result<Vec<Vec<f32>>> {
    let (ids, types) = index_data(bad);
    let extra = p.inputs().get(2).map(|s| data(s.numel(), 6)).unwrap_or_default();
    let mut ins = vec![TensorRef::I64(&ids), TensorRef::I32(&types)];
    if p.inputs().len() == 3 {
        ins.push(TensorRef::F32(&extra));
    }
    let mut outs: Vec<Vec<f32>> = p.outputs().iter().map(|s| vec![f32::NAN; s.numel()]).collect();
    let mut views: Vec<TensorMut<'_>> = outs.iter_mut().map(|v| TensorMut::F32(v)).collect();
    p.run(Target::cpu_best(), &ins, &mut views, par)?;
    Ok(outs)
}

/// The terms of the fused op after the passes, if there is one.
fn fused_terms(g: &Graph) -> Option<Vec<EmbedTerm>> {
    let opt = optimise(g, Passes::default()).unwrap();
    opt.validate().unwrap();
    let mut found = opt.nodes.iter().filter_map(|n| match &n.op {
        Op::EmbedLayerNorm(e) => Some(e.terms.clone()),
        _ => None,
    });
    let terms = found.next();
    assert!(found.next().is_none());
    terms
}

/// Every runnable target, serial and on two threads, computes bit for bit
/// what the graph computes without the fusion.
fn assert_unchanged(g: &Graph) {
    let unfused = Passes {
        patterns: false,
        ..Passes::default()
    };
    for target in Target::ALL.into_iter().filter(|t| t.can_run_on(Target::cpu_best())) {
        let want = run(&compile_with(g, target, unfused).unwrap(), None, &Serial).unwrap();
        let p = compile(g, target).unwrap();
        assert_eq!(run(&p, None, &Serial).unwrap(), want, "{target}");
        assert_eq!(run(&p, None, &ScopedThreads(2)).unwrap(), want, "{target}, 2 threads");
    }
}

#[test]
fn an_embedding_layer_is_one_op_with_the_same_results() {
    use EmbedTerm::{Added, Gathered};
    let g = graph(Miss::default());
    // The position gather folds to a constant (its indices are constant).
    assert_eq!(fused_terms(&g), Some(vec![Gathered, Gathered, Added]));
    let p = compile(&g, Target::cpu_best()).unwrap();
    assert_eq!(p.op_summary(), "EmbedLayerNormalization(3 terms) x1, Relu x1");
    assert_unchanged(&g);
    // Against a reference in f64: sum the rows, normalise, Relu.
    let got = run(&p, None, &Serial).unwrap().remove(0);
    let (ids, types) = index_data(None);
    let (word, seg, pos, gamma, beta) = (
        data(VOCAB * W, 1),
        data(2 * W, 2),
        data(8 * W, 3),
        data(W, 4),
        data(W, 5),
    );
    for r in 0..B * S {
        let id = ids[r].rem_euclid(VOCAB as i64) as usize;
        let t = types[r] as usize;
        let x: Vec<f64> = (0..W)
            .map(|c| (word[id * W + c] + seg[t * W + c] + pos[r % S * W + c]) as f64)
            .collect();
        let mean = x.iter().sum::<f64>() / W as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / W as f64;
        for c in 0..W {
            let want = ((x[c] - mean) / (var + 1e-12).sqrt() * gamma[c] as f64 + beta[c] as f64).max(0.0);
            let have = got[r * W + c] as f64;
            assert!(
                (have - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "row {r} col {c}: {have} vs {want}"
            );
        }
    }
}

#[test]
fn a_bad_index_is_refused_as_the_gather_refuses_it() {
    let g = graph(Miss::default());
    let unfused = Passes {
        patterns: false,
        ..Passes::default()
    };
    for bad in [VOCAB as i64, -(VOCAB as i64) - 1] {
        let fused = run(&compile(&g, Target::cpu_best()).unwrap(), Some(bad), &Serial).unwrap_err();
        let plain = run(
            &compile_with(&g, Target::cpu_best(), unfused).unwrap(),
            Some(bad),
            &Serial,
        )
        .unwrap_err();
        assert_eq!(fused.kind, ErrorKind::InvalidArgument, "{fused}");
        let want = format!("Gather index {bad} is out of range for an axis of {VOCAB}");
        assert!(fused.message.contains(&want), "{fused}");
        assert!(plain.message.contains(&want), "{plain}");
    }
}

#[test]
fn variants_still_fuse_and_near_misses_are_left_alone() {
    use EmbedTerm::{Added, Gathered};
    let cases = [
        // Fused: a gather read elsewhere is added as it is (terms in the
        // order segment, word, position); no bias.
        (
            Miss {
                word_escapes: true,
                ..Miss::default()
            },
            Some(vec![Gathered, Added, Added]),
        ),
        (
            Miss {
                no_bias: true,
                ..Miss::default()
            },
            Some(vec![Gathered, Gathered, Added]),
        ),
        // A term another op makes (a one-input node) is added as it is.
        (
            Miss {
                made_term: true,
                ..Miss::default()
            },
            Some(vec![Gathered, Gathered, Added, Added]),
        ),
        // Left alone: the sum is needed elsewhere, the norm is not over the
        // last axis alone, a term is not a whole row.
        (
            Miss {
                sum_escapes: true,
                ..Miss::default()
            },
            None,
        ),
        (
            Miss {
                two_axes: true,
                ..Miss::default()
            },
            None,
        ),
        (
            Miss {
                narrow_term: true,
                ..Miss::default()
            },
            None,
        ),
    ];
    for (k, (m, want)) in cases.into_iter().enumerate() {
        let g = graph(m);
        assert_eq!(fused_terms(&g), want, "case {k}");
        assert_unchanged(&g);
    }
}

#[test]
fn a_sum_without_a_gather_is_left_alone() {
    let mut b = Builder::new();
    let x = b.input("x", &[B, S, W]);
    let y = b.input("y", &[1, S, W]);
    let s = b.bin(BinaryOp::Add, x, y, "s");
    let gamma = b.constant("gamma", &[W], data(W, 4));
    let ln = Op::LayerNorm {
        axis: 2,
        epsilon: 1e-5,
        decomposed: false,
    };
    let out = b.op(ln, &[s, gamma], "out");
    b.output(out);
    assert_eq!(fused_terms(&b.g), None);
}
