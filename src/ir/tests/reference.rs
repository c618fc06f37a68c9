//! A naive ONNX interpreter in f64 for tests: straight from the operator
//! definitions, sharing no code with kiln's import, compiler or kernels.

use std::collections::HashMap;

use crate::ir::desc::{AttrValue, GraphDesc, NodeDesc, TensorValue};
use crate::kernels::math::reference::erf;

/// A tensor: ONNX element type, shape, values as f64.
#[derive(Clone, Debug, PartialEq)]
pub struct T {
    pub ty: i32,
    pub shape: Vec<usize>,
    pub v: Vec<f64>,
}

impl T {
    pub fn new(ty: i32, shape: &[usize], v: Vec<f64>) -> T {
        assert_eq!(shape.iter().product::<usize>(), v.len());
        T {
            ty,
            shape: shape.to_vec(),
            v,
        }
    }

    pub fn from_value(t: &TensorValue) -> T {
        let v: Vec<f64> = match t.elem_type {
            1 => t
                .bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            7 => t
                .bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            6 => t
                .bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            9 => t.bytes.iter().map(|&b| b as f64).collect(),
            e => panic!("type {e}"),
        };
        T::new(t.elem_type, &t.shape, v)
    }

    fn ints(&self) -> Vec<i64> {
        self.v.iter().map(|&x| x as i64).collect()
    }
}

fn strides(s: &[usize]) -> Vec<usize> {
    let mut st = vec![1; s.len()];
    for i in (0..s.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * s[i + 1];
    }
    st
}

fn unravel(mut i: usize, s: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; s.len()];
    for d in (0..s.len()).rev() {
        idx[d] = i % s[d].max(1);
        i /= s[d].max(1);
    }
    idx
}

fn bshape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
            let db = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
            if da == 1 {
                db
            } else {
                assert!(db == 1 || db == da, "{a:?} vs {b:?}");
                da
            }
        })
        .collect()
}

/// Element of `t` at output multi-index `idx` under broadcasting.
fn at(t: &T, idx: &[usize]) -> f64 {
    let pad = idx.len() - t.shape.len();
    let st = strides(&t.shape);
    let mut flat = 0;
    for d in 0..t.shape.len() {
        if t.shape[d] != 1 {
            flat += idx[pad + d] * st[d];
        }
    }
    t.v[flat]
}

fn map2(a: &T, b: &T, ty: i32, f: impl Fn(f64, f64) -> f64) -> T {
    let s = bshape(&a.shape, &b.shape);
    let n: usize = s.iter().product();
    T::new(
        ty,
        &s,
        (0..n)
            .map(|i| {
                let idx = unravel(i, &s);
                f(at(a, &idx), at(b, &idx))
            })
            .collect(),
    )
}

fn attr_i(n: &NodeDesc, k: &str, d: i64) -> i64 {
    match n.attrs.get(k) {
        Some(AttrValue::Int(v)) => *v,
        _ => d,
    }
}

fn attr_f(n: &NodeDesc, k: &str, d: f64) -> f64 {
    match n.attrs.get(k) {
        Some(AttrValue::Float(v)) => *v as f64,
        _ => d,
    }
}

fn attr_is(n: &NodeDesc, k: &str) -> Option<Vec<i64>> {
    match n.attrs.get(k) {
        Some(AttrValue::Ints(v)) => Some(v.clone()),
        _ => None,
    }
}

fn axis(a: i64, r: usize) -> usize {
    if a < 0 {
        (a + r as i64) as usize
    } else {
        a as usize
    }
}

fn round_ty(ty: i32, x: f64) -> f64 {
    match ty {
        1 => x as f32 as f64,
        6 => (x as i32) as f64,
        7 => (x as i64) as f64,
        9 => (x != 0.0) as u8 as f64,
        _ => x,
    }
}

fn matmul(a: &T, b: &T, ta: bool, tb: bool) -> T {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k) = if ta {
        (a.shape[ra - 1], a.shape[ra - 2])
    } else {
        (a.shape[ra - 2], a.shape[ra - 1])
    };
    let n = if tb { b.shape[rb - 2] } else { b.shape[rb - 1] };
    let batch = bshape(&a.shape[..ra - 2], &b.shape[..rb - 2]);
    let nb: usize = batch.iter().product();
    let mut out = Vec::with_capacity(nb * m * n);
    let abatch = T::new(
        1,
        &a.shape[..ra - 2],
        (0..a.shape[..ra - 2].iter().product()).map(|i| i as f64).collect(),
    );
    let bbatch = T::new(
        1,
        &b.shape[..rb - 2],
        (0..b.shape[..rb - 2].iter().product()).map(|i| i as f64).collect(),
    );
    for bi in 0..nb {
        let idx = unravel(bi, &batch);
        let ao = at(&abatch, &idx) as usize * m * k;
        let bo = at(&bbatch, &idx) as usize * k * n;
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    let av = if ta { a.v[ao + p * m + i] } else { a.v[ao + i * k + p] };
                    let bv = if tb { b.v[bo + j * k + p] } else { b.v[bo + p * n + j] };
                    s += av * bv;
                }
                out.push(s);
            }
        }
    }
    let mut s = batch;
    s.extend([m, n]);
    T::new(1, &s, out)
}

fn reduce(x: &T, axes: &[usize], keep: bool, f: &str) -> T {
    let r = x.shape.len();
    let os: Vec<usize> = (0..r).map(|d| if axes.contains(&d) { 1 } else { x.shape[d] }).collect();
    let n: usize = os.iter().product();
    let mut acc = vec![if f == "max" { f64::NEG_INFINITY } else { 0.0 }; n];
    let ost = strides(&os);
    for i in 0..x.v.len() {
        let idx = unravel(i, &x.shape);
        let o: usize = (0..r)
            .map(|d| if axes.contains(&d) { 0 } else { idx[d] * ost[d] })
            .sum();
        acc[o] = if f == "max" {
            acc[o].max(x.v[i])
        } else {
            acc[o] + x.v[i]
        };
    }
    let cnt: usize = axes.iter().map(|&a| x.shape[a]).product();
    if f == "mean" {
        acc.iter_mut().for_each(|v| *v /= cnt as f64);
    }
    let shape: Vec<usize> = if keep {
        os
    } else {
        (0..r).filter(|d| !axes.contains(d)).map(|d| x.shape[d]).collect()
    };
    T::new(x.ty, &shape, acc)
}

/// Runs `g` on `inputs` (by name) with `consts`; returns the graph outputs.
pub fn run(g: &GraphDesc, consts: &HashMap<String, TensorValue>, inputs: &HashMap<String, T>) -> Vec<T> {
    let mut env: HashMap<String, T> = inputs.clone();
    for (k, v) in consts {
        env.insert(k.clone(), T::from_value(v));
    }
    for n in &g.nodes {
        let get = |k: usize| -> Option<T> { n.inputs.get(k).filter(|s| !s.is_empty()).map(|s| env[s].clone()) };
        let x = get(0);
        let op = n.op_type.as_str();
        let un = |f: &dyn Fn(f64) -> f64| {
            let x = x.clone().unwrap();
            T::new(1, &x.shape, x.v.iter().map(|&v| f(v)).collect())
        };
        let outs: Vec<T> = match op {
            "Relu" => vec![un(&|v| v.max(0.0))],
            "Sigmoid" => vec![un(&|v| 1.0 / (1.0 + (-v).exp()))],
            "Tanh" => vec![un(&|v| v.tanh())],
            "Neg" => vec![un(&|v| -v)],
            "Abs" => vec![un(&|v| v.abs())],
            "Sqrt" => vec![un(&|v| v.sqrt())],
            "Exp" => vec![un(&|v| v.exp())],
            "Log" => vec![un(&|v| v.ln())],
            "Erf" => vec![un(&erf)],
            "Reciprocal" => vec![un(&|v| 1.0 / v)],
            "LeakyRelu" => {
                let a = attr_f(n, "alpha", 0.01);
                vec![un(&|v| if v < 0.0 { a * v } else { v })]
            }
            "Gelu" => {
                let tanh = matches!(n.attrs.get("approximate"), Some(AttrValue::String(s)) if s == "tanh");
                vec![un(&|v| {
                    if tanh {
                        crate::kernels::math::reference::gelu_tanh(v)
                    } else {
                        0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2))
                    }
                })]
            }
            "Clip" => {
                let (lo, hi) = if n.since_version < 11 {
                    (attr_f(n, "min", f64::NEG_INFINITY), attr_f(n, "max", f64::INFINITY))
                } else {
                    (
                        get(1).map_or(f64::NEG_INFINITY, |t| t.v[0]),
                        get(2).map_or(f64::INFINITY, |t| t.v[0]),
                    )
                };
                vec![un(&|v| v.max(lo).min(hi))]
            }
            "Add" | "Sub" | "Mul" | "Div" | "Pow" => {
                let (a, b) = (x.clone().unwrap(), get(1).unwrap());
                let ty = a.ty;
                vec![map2(&a, &b, ty, |p, q| {
                    let r = match op {
                        "Add" => p + q,
                        "Sub" => p - q,
                        "Mul" => p * q,
                        "Div" if ty != 1 => (p / q).trunc(),
                        "Div" => p / q,
                        _ => p.powf(q),
                    };
                    round_ty(ty, r)
                })]
            }
            "MatMul" => {
                let (mut a, mut b) = (x.clone().unwrap(), get(1).unwrap());
                let (a1, b1) = (a.shape.len() == 1, b.shape.len() == 1);
                if a1 {
                    a.shape.insert(0, 1);
                }
                if b1 {
                    b.shape.push(1);
                }
                let mut y = matmul(&a, &b, false, false);
                let r = y.shape.len();
                if b1 {
                    y.shape.remove(r - 1);
                }
                if a1 {
                    y.shape.remove(r - 2);
                }
                vec![y]
            }
            "Gemm" => {
                let y = matmul(
                    &x.clone().unwrap(),
                    &get(1).unwrap(),
                    attr_i(n, "transA", 0) != 0,
                    attr_i(n, "transB", 0) != 0,
                );
                let alpha = attr_f(n, "alpha", 1.0);
                let beta = attr_f(n, "beta", 1.0);
                let y = T::new(1, &y.shape, y.v.iter().map(|v| v * alpha).collect());
                vec![match get(2) {
                    Some(c) => map2(&y, &c, 1, |p, q| p + beta * q),
                    None => y,
                }]
            }
            "Softmax" => {
                let x = x.clone().unwrap();
                let r = x.shape.len();
                let a = axis(attr_i(n, "axis", if n.since_version < 13 { 1 } else { -1 }), r);
                let axes: Vec<usize> = if n.since_version < 13 {
                    (a..r).collect()
                } else {
                    vec![a]
                };
                let m = reduce(&x, &axes, true, "max");
                let e = map2(&x, &m, 1, |p, q| (p - q).exp());
                let s = reduce(&e, &axes, true, "sum");
                vec![map2(&e, &s, 1, |p, q| p / q)]
            }
            "LayerNormalization" => {
                let x = x.clone().unwrap();
                let r = x.shape.len();
                let a = axis(attr_i(n, "axis", -1), r);
                let axes: Vec<usize> = (a..r).collect();
                let mu = reduce(&x, &axes, true, "mean");
                let d = map2(&x, &mu, 1, |p, q| p - q);
                let var = reduce(&map2(&d, &d, 1, |p, q| p * q), &axes, true, "mean");
                let eps = attr_f(n, "epsilon", 1e-5);
                let y = map2(&d, &var, 1, |p, q| p / (q + eps).sqrt());
                let y = map2(&y, &get(1).unwrap(), 1, |p, q| p * q);
                vec![match get(2) {
                    Some(b) => map2(&y, &b, 1, |p, q| p + q),
                    None => y,
                }]
            }
            "ReduceMean" | "ReduceSum" | "ReduceMax" => {
                let x = x.clone().unwrap();
                let from_input = if op == "ReduceSum" {
                    n.since_version >= 13
                } else {
                    n.since_version >= 18
                };
                let axes = if from_input {
                    get(1).map(|t| t.ints())
                } else {
                    attr_is(n, "axes")
                };
                let r = x.shape.len();
                let mut axes: Vec<usize> = match axes {
                    Some(a) if !a.is_empty() => a.iter().map(|&v| axis(v, r)).collect(),
                    _ => (0..r).collect(),
                };
                axes.sort();
                let f = match op {
                    "ReduceMean" => "mean",
                    "ReduceSum" => "sum",
                    _ => "max",
                };
                vec![reduce(&x, &axes, attr_i(n, "keepdims", 1) != 0, f)]
            }
            "Reshape" => {
                let x = x.clone().unwrap();
                let spec = get(1).unwrap().ints();
                let total = x.v.len();
                let mut s: Vec<usize> = spec
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| {
                        if d == 0 {
                            x.shape[i]
                        } else if d < 0 {
                            1
                        } else {
                            d as usize
                        }
                    })
                    .collect();
                if let Some(i) = spec.iter().position(|&d| d == -1) {
                    s[i] = total / s.iter().product::<usize>();
                }
                vec![T::new(x.ty, &s, x.v)]
            }
            "Flatten" => {
                let x = x.clone().unwrap();
                let a = axis(attr_i(n, "axis", 1), x.shape.len());
                let s = [x.shape[..a].iter().product(), x.shape[a..].iter().product()];
                vec![T::new(x.ty, &s, x.v)]
            }
            "Squeeze" | "Unsqueeze" => {
                let x = x.clone().unwrap();
                let axes = if n.since_version < 13 {
                    attr_is(n, "axes")
                } else {
                    get(1).map(|t| t.ints())
                };
                let s: Vec<usize> = if op == "Squeeze" {
                    match axes {
                        None => x.shape.iter().copied().filter(|&d| d != 1).collect(),
                        Some(a) => {
                            let a: Vec<usize> = a.iter().map(|&v| axis(v, x.shape.len())).collect();
                            (0..x.shape.len())
                                .filter(|d| !a.contains(d))
                                .map(|d| x.shape[d])
                                .collect()
                        }
                    }
                } else {
                    let a = axes.unwrap();
                    let r = x.shape.len() + a.len();
                    let a: Vec<usize> = a.iter().map(|&v| axis(v, r)).collect();
                    let mut it = x.shape.iter();
                    (0..r)
                        .map(|d| if a.contains(&d) { 1 } else { *it.next().unwrap() })
                        .collect()
                };
                vec![T::new(x.ty, &s, x.v)]
            }
            "Identity" => vec![x.clone().unwrap()],
            "Dropout" => {
                let x = x.clone().unwrap();
                let mask = T::new(9, &x.shape, vec![1.0; x.v.len()]);
                vec![x, mask]
            }
            "Transpose" => {
                let x = x.clone().unwrap();
                let r = x.shape.len();
                let perm: Vec<usize> = attr_is(n, "perm")
                    .map(|p| p.iter().map(|&v| v as usize).collect())
                    .unwrap_or((0..r).rev().collect());
                let s: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
                let st = strides(&x.shape);
                let v = (0..x.v.len())
                    .map(|i| {
                        let idx = unravel(i, &s);
                        x.v[(0..r).map(|d| idx[d] * st[perm[d]]).sum::<usize>()]
                    })
                    .collect();
                vec![T::new(x.ty, &s, v)]
            }
            "Concat" => {
                let parts: Vec<T> = (0..n.inputs.len()).map(|k| get(k).unwrap()).collect();
                let r = parts[0].shape.len();
                let a = axis(attr_i(n, "axis", 0), r);
                let mut s = parts[0].shape.clone();
                s[a] = parts.iter().map(|p| p.shape[a]).sum();
                let n_out: usize = s.iter().product();
                let v = (0..n_out)
                    .map(|i| {
                        let mut idx = unravel(i, &s);
                        let mut k = 0;
                        while idx[a] >= parts[k].shape[a] {
                            idx[a] -= parts[k].shape[a];
                            k += 1;
                        }
                        parts[k].v[(0..r).map(|d| idx[d] * strides(&parts[k].shape)[d]).sum::<usize>()]
                    })
                    .collect();
                vec![T::new(parts[0].ty, &s, v)]
            }
            "Split" | "Slice" => {
                let x = x.clone().unwrap();
                let r = x.shape.len();
                // Each output as (per-axis start, step, count).
                let specs: Vec<Vec<(usize, i64, usize)>> = if op == "Split" {
                    let a = axis(attr_i(n, "axis", 0), r);
                    let sizes: Vec<usize> = if n.since_version < 13 {
                        attr_is(n, "split")
                    } else {
                        get(1).map(|t| t.ints())
                    }
                    .map(|v| v.iter().map(|&d| d as usize).collect())
                    .unwrap_or_else(|| {
                        let k = n.outputs.len();
                        let each = if n.since_version >= 18 {
                            x.shape[a].div_ceil(k)
                        } else {
                            x.shape[a] / k
                        };
                        (0..k)
                            .map(|i| each.min(x.shape[a] - (i * each).min(x.shape[a])))
                            .collect()
                    });
                    let mut off = 0;
                    sizes
                        .iter()
                        .map(|&sz| {
                            let spec = (0..r)
                                .map(|d| if d == a { (off, 1, sz) } else { (0, 1, x.shape[d]) })
                                .collect();
                            off += sz;
                            spec
                        })
                        .collect()
                } else {
                    let (st, en, ax, sp) = if n.since_version < 10 {
                        (
                            attr_is(n, "starts").unwrap(),
                            attr_is(n, "ends").unwrap(),
                            attr_is(n, "axes"),
                            None,
                        )
                    } else {
                        (
                            get(1).unwrap().ints(),
                            get(2).unwrap().ints(),
                            get(3).map(|t| t.ints()),
                            get(4).map(|t| t.ints()),
                        )
                    };
                    let ax = ax.unwrap_or((0..st.len() as i64).collect());
                    let sp = sp.unwrap_or(vec![1; st.len()]);
                    let mut spec: Vec<(usize, i64, usize)> = (0..r).map(|d| (0, 1, x.shape[d])).collect();
                    for k in 0..st.len() {
                        let d = axis(ax[k], r);
                        let dim = x.shape[d] as i64;
                        let f = |v: i64| if v < 0 { v + dim } else { v };
                        let step = sp[k];
                        let mut idx = vec![];
                        let mut i = if step > 0 {
                            f(st[k]).clamp(0, dim)
                        } else {
                            f(st[k]).clamp(0, dim - 1)
                        };
                        let e = if step > 0 {
                            f(en[k]).clamp(0, dim)
                        } else {
                            f(en[k]).clamp(-1, dim - 1)
                        };
                        while (step > 0 && i < e) || (step < 0 && i > e) {
                            idx.push(i);
                            i += step;
                        }
                        spec[d] = (idx.first().copied().unwrap_or(0) as usize, step, idx.len());
                    }
                    vec![spec]
                };
                specs
                    .into_iter()
                    .map(|spec| {
                        let s: Vec<usize> = spec.iter().map(|t| t.2).collect();
                        let st = strides(&x.shape);
                        let n_out: usize = s.iter().product();
                        let v = (0..n_out)
                            .map(|i| {
                                let idx = unravel(i, &s);
                                let flat: i64 = (0..r)
                                    .map(|d| (spec[d].0 as i64 + idx[d] as i64 * spec[d].1) * st[d] as i64)
                                    .sum();
                                x.v[flat as usize]
                            })
                            .collect();
                        T::new(x.ty, &s, v)
                    })
                    .collect()
            }
            "Gather" => {
                let (x, ind) = (x.clone().unwrap(), get(1).unwrap());
                let r = x.shape.len();
                let a = axis(attr_i(n, "axis", 0), r);
                let mut s = x.shape[..a].to_vec();
                s.extend(&ind.shape);
                s.extend(&x.shape[a + 1..]);
                let st = strides(&x.shape);
                let n_out: usize = s.iter().product();
                let q = ind.shape.len();
                let v = (0..n_out)
                    .map(|i| {
                        let idx = unravel(i, &s);
                        let ii: usize = (0..q).map(|k| idx[a + k] * strides(&ind.shape)[k]).sum();
                        let mut j = ind.v[ii] as i64;
                        if j < 0 {
                            j += x.shape[a] as i64;
                        }
                        let mut flat = j as usize * st[a];
                        for d in 0..a {
                            flat += idx[d] * st[d];
                        }
                        for d in a + 1..r {
                            flat += idx[d - 1 + q] * st[d];
                        }
                        x.v[flat]
                    })
                    .collect();
                vec![T::new(x.ty, &s, v)]
            }
            "Cast" => {
                let x = x.clone().unwrap();
                let to = attr_i(n, "to", 1) as i32;
                vec![T::new(to, &x.shape, x.v.iter().map(|&v| round_ty(to, v)).collect())]
            }
            "Shape" => {
                let x = x.clone().unwrap();
                let r = x.shape.len() as i64;
                let c = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let (s, e) = (c(attr_i(n, "start", 0)), c(attr_i(n, "end", r)));
                vec![T::new(7, &[e - s], x.shape[s..e].iter().map(|&d| d as f64).collect())]
            }
            "Constant" => vec![match n.attrs.values().next().unwrap() {
                AttrValue::Tensor(t) => T::from_value(t),
                AttrValue::Float(f) => T::new(1, &[], vec![*f as f64]),
                AttrValue::Ints(v) => T::new(7, &[v.len()], v.iter().map(|&x| x as f64).collect()),
                AttrValue::Int(v) => T::new(7, &[], vec![*v as f64]),
                other => panic!("{other:?}"),
            }],
            "ConstantOfShape" => {
                let s: Vec<usize> = x.clone().unwrap().ints().iter().map(|&d| d as usize).collect();
                let val = match n.attrs.get("value") {
                    Some(AttrValue::Tensor(t)) => T::from_value(t),
                    _ => T::new(1, &[1], vec![0.0]),
                };
                vec![T::new(val.ty, &s, vec![val.v[0]; s.iter().product()])]
            }
            "Where" => {
                let (c, a, b) = (x.clone().unwrap(), get(1).unwrap(), get(2).unwrap());
                let s = bshape(&bshape(&c.shape, &a.shape), &b.shape);
                let n_out: usize = s.iter().product();
                let v = (0..n_out)
                    .map(|i| {
                        let idx = unravel(i, &s);
                        if at(&c, &idx) != 0.0 {
                            at(&a, &idx)
                        } else {
                            at(&b, &idx)
                        }
                    })
                    .collect();
                vec![T::new(a.ty, &s, v)]
            }
            "Expand" => {
                let x = x.clone().unwrap();
                let spec: Vec<usize> = get(1).unwrap().ints().iter().map(|&d| d as usize).collect();
                let s = bshape(&x.shape, &spec);
                let n_out: usize = s.iter().product();
                vec![T::new(x.ty, &s, (0..n_out).map(|i| at(&x, &unravel(i, &s))).collect())]
            }
            other => panic!("reference has no {other}"),
        };
        for (name, t) in n.outputs.iter().zip(outs) {
            if !name.is_empty() {
                env.insert(name.clone(), t);
            }
        }
    }
    g.outputs.iter().map(|o| env[o].clone()).collect()
}
