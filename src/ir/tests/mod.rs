//! IR types, import/check_support, and end-to-end tests (ONNX description →
//! import → compile → run) against the naive interpreter in `reference`.

mod f16;
mod props;
pub(crate) mod reference;
// Layout and BatchNormalization (issue #13).
mod batch_norm;

use std::collections::{BTreeMap, HashMap};

pub(crate) use reference::T;

use super::desc::*;
use super::*;
use crate::compiler::{check_support, compile, import};
use crate::kernels::parallel::{ScopedThreads, Serial};
use crate::plan::{Program, TensorMut, TensorRef};
use crate::target::Target;

#[test]
fn dtype_codes_and_broadcasting() {
    assert_eq!(DType::from_onnx(1), Some(DType::F32));
    assert_eq!(DType::from_onnx(7), Some(DType::I64));
    assert_eq!(DType::from_onnx(10), Some(DType::F16));
    assert_eq!(DType::from_onnx(11), None);
    assert_eq!(DType::I64.size(), 8);
    assert_eq!(DType::Bool.to_string(), "bool");
    assert_eq!(onnx_type_name(10), "float16");
    let b = broadcast_shapes;
    assert_eq!(b(&[2, 3, 4], &[3, 1]), Some(vec![2, 3, 4]));
    assert_eq!(b(&[], &[]), Some(vec![]));
    assert_eq!(b(&[2, 3], &[4]), None);
    assert_eq!(TensorType::f32(&[2, 3]).to_string(), "float[2,3]");
    assert_eq!(TensorType::new(DType::I64, &[usize::MAX, 2]).checked_numel(), None);
}

/// Builds GraphDescs tersely; values are typed only where ORT would know
/// (inputs, initializers), intermediates are left to kiln's inference.
pub(crate) struct D {
    pub g: GraphDesc,
    pub consts: HashMap<String, TensorValue>,
    pub opset: i32,
    k: usize,
}

pub(crate) type Attrs = Vec<(&'static str, AttrValue)>;

pub(crate) fn tv_f32(shape: &[usize], v: &[f32]) -> TensorValue {
    TensorValue {
        elem_type: 1,
        shape: shape.to_vec(),
        bytes: bytemuck::cast_slice(v).to_vec(),
    }
}

pub(crate) fn tv_i64(shape: &[usize], v: &[i64]) -> TensorValue {
    TensorValue {
        elem_type: 7,
        shape: shape.to_vec(),
        bytes: bytemuck::cast_slice(v).to_vec(),
    }
}

pub(crate) fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

impl D {
    pub fn new(opset: i32) -> D {
        D {
            g: GraphDesc::default(),
            consts: HashMap::new(),
            opset,
            k: 0,
        }
    }

    pub fn input(&mut self, name: &str, ty: i32, dims: &[i64]) -> String {
        self.g.values.insert(name.into(), ValueDesc::new(ty, dims));
        self.g.inputs.push(name.into());
        name.into()
    }

    pub fn init(&mut self, name: &str, t: TensorValue) -> String {
        let dims: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        self.g.values.insert(name.into(), ValueDesc::new(t.elem_type, &dims));
        self.consts.insert(name.into(), t);
        name.into()
    }

    pub fn f32s(&mut self, name: &str, shape: &[usize], seed: usize) -> String {
        // Weight-sized values, so deep graphs stay well conditioned.
        let n = shape.iter().product();
        let v: Vec<f32> = data(n, seed).iter().map(|x| x * 0.25).collect();
        self.init(name, tv_f32(shape, &v))
    }

    pub fn i64s(&mut self, name: &str, v: &[i64]) -> String {
        self.init(name, tv_i64(&[v.len()], v))
    }

    pub fn nodes(&mut self, op: &str, ins: &[&str], n_out: usize, attrs: Attrs) -> Vec<String> {
        self.k += 1;
        let outs: Vec<String> = (0..n_out).map(|i| format!("{op}_{}_{i}", self.k)).collect();
        self.g.nodes.push(NodeDesc {
            name: format!("{op}_{}", self.k),
            domain: String::new(),
            op_type: op.into(),
            since_version: self.opset,
            inputs: ins.iter().map(|s| s.to_string()).collect(),
            outputs: outs.clone(),
            attrs: attrs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<BTreeMap<_, _>>(),
        });
        outs
    }

    pub fn node(&mut self, op: &str, ins: &[&str], attrs: Attrs) -> String {
        self.nodes(op, ins, 1, attrs).remove(0)
    }

    pub fn output(&mut self, name: &str) {
        self.g.outputs.push(name.into());
    }
}

/// Deterministic values in about [-2, 2).
pub(crate) fn data(n: usize, seed: usize) -> Vec<f32> {
    let mut s = (seed as u32).wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 4000) as f32 / 1000.0 - 2.0
        })
        .collect()
}

/// Typed storage for a run's tensors.
pub(crate) enum Owned {
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<u8>),
}

impl Owned {
    fn of(t: &T) -> Owned {
        match t.ty {
            1 => Owned::F32(t.v.iter().map(|&x| x as f32).collect()),
            7 => Owned::I64(t.v.iter().map(|&x| x as i64).collect()),
            6 => Owned::I32(t.v.iter().map(|&x| x as i32).collect()),
            9 => Owned::Bool(t.v.iter().map(|&x| x as u8).collect()),
            e => panic!("{e}"),
        }
    }

    fn zeros(ty: i32, n: usize) -> Owned {
        Owned::of(&T::new(ty, &[n], vec![0.0; n]))
    }

    fn view(&self) -> TensorRef<'_> {
        match self {
            Owned::F32(v) => TensorRef::F32(v),
            Owned::I64(v) => TensorRef::I64(v),
            Owned::I32(v) => TensorRef::I32(v),
            Owned::Bool(v) => TensorRef::Bool(v),
        }
    }

    fn view_mut(&mut self) -> TensorMut<'_> {
        match self {
            Owned::F32(v) => TensorMut::F32(v),
            Owned::I64(v) => TensorMut::I64(v),
            Owned::I32(v) => TensorMut::I32(v),
            Owned::Bool(v) => TensorMut::Bool(v),
        }
    }

    fn values(&self) -> Vec<f64> {
        match self {
            Owned::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Owned::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Owned::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Owned::Bool(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }
}

/// Runs a program on reference tensors (in the program's input order).
pub(crate) fn run_program(p: &Program, inputs: &[T], par: &dyn crate::kernels::parallel::Parallel) -> Vec<Vec<f64>> {
    let ins: Vec<Owned> = inputs.iter().map(Owned::of).collect();
    let views: Vec<TensorRef<'_>> = ins.iter().map(Owned::view).collect();
    let mut outs: Vec<Owned> = p
        .outputs()
        .iter()
        .map(|s| Owned::zeros(s.elem_type, s.numel()))
        .collect();
    let mut out_views: Vec<TensorMut<'_>> = outs.iter_mut().map(Owned::view_mut).collect();
    p.run(Target::cpu_best(), &views, &mut out_views, par).unwrap();
    drop(out_views);
    outs.iter().map(Owned::values).collect()
}

pub(crate) fn compare(got: &[Vec<f64>], want: &[T], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.v.len(), "output {k} length");
        for (i, (&x, &y)) in g.iter().zip(&w.v).enumerate() {
            let ok = x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * (1.0 + y.abs());
            assert!(ok, "output {k}[{i}]: kiln {x}, reference {y}");
        }
    }
}

/// Random inputs for `d`'s graph inputs (int inputs in `0..int_range`).
pub(crate) fn random_inputs(d: &D, int_range: i64) -> Vec<T> {
    d.g.inputs
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let desc = &d.g.values[name];
            let shape: Vec<usize> = desc.dims.as_ref().unwrap().iter().map(|&x| x as usize).collect();
            let n = shape.iter().product();
            let v: Vec<f64> = match desc.elem_type {
                1 => data(n, 100 + k).iter().map(|&x| x as f64).collect(),
                9 => (0..n).map(|i| ((i * 7 + k) % 3 != 0) as u8 as f64).collect(),
                _ => (0..n).map(|i| ((i * 7 + k * 3) as i64 % int_range) as f64).collect(),
            };
            T::new(desc.elem_type, &shape, v)
        })
        .collect()
}

/// check_support says Ok to every node; import + compile + run match the
/// reference on every runnable target. Returns the host program.
pub(crate) fn check_and_run(d: &D, inputs: &[T], tol: f64) -> Program {
    let support = check_support(&d.g, &d.consts, &[]);
    for (n, s) in d.g.nodes.iter().zip(&support) {
        assert_eq!(s, &Ok(()), "node {} ({})", n.name, n.op_type);
    }
    let named: HashMap<String, T> = d.g.inputs.iter().cloned().zip(inputs.iter().cloned()).collect();
    let want = reference::run(&d.g, &d.consts, &named);
    let ir = import(&d.g, &d.consts).unwrap();
    let mut host = None;
    for target in Target::ALL {
        let p = compile(&ir, target).unwrap();
        if target.can_run_on(Target::cpu_best()) {
            compare(&run_program(&p, inputs, &Serial), &want, tol);
            host.get_or_insert(p);
        }
    }
    host.unwrap()
}

/// One-node graph over float inputs of the given shapes (plus `extra`
/// constant inputs), checked against the reference.
fn one(opset: i32, op: &str, shapes: &[&[i64]], extra: &[TensorValue], attrs: Attrs) -> Program {
    let mut d = D::new(opset);
    let mut ins: Vec<String> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| d.input(&format!("x{i}"), 1, s))
        .collect();
    for (i, t) in extra.iter().enumerate() {
        ins.push(d.init(&format!("c{i}"), t.clone()));
    }
    let refs: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
    let y = d.node(op, &refs, attrs);
    d.output(&y);
    let inputs = random_inputs(&d, 3);
    check_and_run(&d, &inputs, 2e-6)
}

#[test]
fn elementwise_ops_match_reference() {
    for op in ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Erf", "Reciprocal"] {
        one(13, op, &[&[3, 17]], &[], vec![]);
    }
    one(
        13,
        "LeakyRelu",
        &[&[3, 17]],
        &[],
        vec![("alpha", AttrValue::Float(0.2))],
    );
    one(20, "Gelu", &[&[3, 17]], &[], vec![]);
    one(
        20,
        "Gelu",
        &[&[3, 17]],
        &[],
        vec![("approximate", AttrValue::String("tanh".into()))],
    );
    one(
        6,
        "Clip",
        &[&[3, 17]],
        &[],
        vec![("min", AttrValue::Float(-0.5)), ("max", AttrValue::Float(1.0))],
    );
    one(
        13,
        "Clip",
        &[&[3, 17]],
        &[tv_f32(&[], &[-0.5]), tv_f32(&[], &[0.25])],
        vec![],
    );
    for op in ["Add", "Sub", "Mul", "Div"] {
        one(13, op, &[&[2, 3, 4], &[3, 1]], &[], vec![]);
        one(13, op, &[&[4]], &[tv_f32(&[2, 1, 4], &data(8, 3))], vec![]);
    }
    // Positive bases for Pow and logs.
    let mut d = D::new(13);
    let x = d.input("x", 1, &[2, 5]);
    let a = d.node("Abs", &[&x], vec![]);
    let e = d.f32s("e", &[5], 1);
    let p = d.node("Pow", &[&a, &e], vec![]);
    let two = d.i64s("two", &[2]);
    let q = d.node("Pow", &[&a, &two], vec![]);
    let l = d.node("Log", &[&q], vec![]);
    let s = d.node("Sqrt", &[&a], vec![]);
    d.output(&p);
    d.output(&l);
    d.output(&s);
    let inputs = random_inputs(&d, 3);
    check_and_run(&d, &inputs, 2e-6);
}

#[test]
fn matmul_gemm_variants() {
    one(13, "MatMul", &[&[2, 3, 4, 5], &[3, 5, 6]], &[], vec![]);
    one(13, "MatMul", &[&[5], &[5, 6]], &[], vec![]);
    one(13, "MatMul", &[&[2, 4, 5], &[5]], &[], vec![]);
    one(13, "MatMul", &[&[7, 5]], &[tv_f32(&[5, 9], &data(45, 2))], vec![]);
    let gemm_attrs = || {
        vec![
            ("transA", AttrValue::Int(1)),
            ("transB", AttrValue::Int(1)),
            ("alpha", AttrValue::Float(0.5)),
            ("beta", AttrValue::Float(2.0)),
        ]
    };
    one(
        13,
        "Gemm",
        &[&[5, 4], &[6, 5]],
        &[tv_f32(&[6], &data(6, 1))],
        gemm_attrs(),
    );
    one(13, "Gemm", &[&[5, 4], &[6, 5], &[4, 6]], &[], gemm_attrs());
    one(13, "Gemm", &[&[5, 4], &[6, 5], &[4, 1]], &[], gemm_attrs());
    one(
        13,
        "Gemm",
        &[&[4, 5]],
        &[tv_f32(&[5, 6], &data(30, 1)), tv_f32(&[4, 1], &data(4, 2))],
        vec![],
    );
    one(13, "Gemm", &[&[4, 5]], &[tv_f32(&[5, 6], &data(30, 1))], vec![]);
}

#[test]
fn normalisation_and_reduction_ops() {
    one(13, "Softmax", &[&[2, 3, 7]], &[], vec![("axis", AttrValue::Int(1))]);
    one(13, "Softmax", &[&[2, 3, 7]], &[], vec![]);
    one(11, "Softmax", &[&[2, 3, 7]], &[], vec![("axis", AttrValue::Int(1))]);
    one(11, "Softmax", &[&[2, 3, 7]], &[], vec![]);
    one(
        17,
        "LayerNormalization",
        &[&[2, 3, 8]],
        &[tv_f32(&[8], &data(8, 1)), tv_f32(&[8], &data(8, 2))],
        vec![],
    );
    one(
        17,
        "LayerNormalization",
        &[&[2, 3, 8]],
        &[tv_f32(&[3, 8], &data(24, 1))],
        vec![("axis", AttrValue::Int(1)), ("epsilon", AttrValue::Float(1e-3))],
    );
    for keep in [0, 1] {
        one(
            13,
            "ReduceMean",
            &[&[2, 3, 4]],
            &[],
            vec![("axes", ints(&[-1])), ("keepdims", AttrValue::Int(keep))],
        );
        one(
            18,
            "ReduceMean",
            &[&[2, 3, 4]],
            &[tv_i64(&[2], &[1, 2])],
            vec![("keepdims", AttrValue::Int(keep))],
        );
        one(
            11,
            "ReduceSum",
            &[&[2, 3, 4]],
            &[],
            vec![("axes", ints(&[0])), ("keepdims", AttrValue::Int(keep))],
        );
        one(
            13,
            "ReduceSum",
            &[&[2, 3, 4]],
            &[tv_i64(&[1], &[1])],
            vec![("keepdims", AttrValue::Int(keep))],
        );
        one(
            13,
            "ReduceMax",
            &[&[2, 3, 4]],
            &[],
            vec![("keepdims", AttrValue::Int(keep))],
        );
    }
    one(13, "ReduceSum", &[&[2, 3, 4]], &[], vec![]);
}

#[test]
fn layout_ops() {
    one(13, "Reshape", &[&[2, 3, 4]], &[tv_i64(&[3], &[0, -1, 2])], vec![]);
    one(13, "Transpose", &[&[2, 3, 4]], &[], vec![("perm", ints(&[1, 2, 0]))]);
    one(13, "Transpose", &[&[2, 3, 4]], &[], vec![]);
    one(13, "Flatten", &[&[2, 3, 4]], &[], vec![("axis", AttrValue::Int(-1))]);
    one(11, "Squeeze", &[&[2, 1, 4, 1]], &[], vec![("axes", ints(&[1]))]);
    one(13, "Squeeze", &[&[2, 1, 4, 1]], &[], vec![]);
    one(13, "Squeeze", &[&[2, 1, 4, 1]], &[tv_i64(&[1], &[-1])], vec![]);
    one(11, "Unsqueeze", &[&[2, 4]], &[], vec![("axes", ints(&[0, 3]))]);
    one(13, "Unsqueeze", &[&[2, 4]], &[tv_i64(&[1], &[-1])], vec![]);
    one(13, "Identity", &[&[2, 4]], &[], vec![]);
    one(
        13,
        "Concat",
        &[&[2, 3], &[2, 5]],
        &[tv_f32(&[2, 1], &[1.0, 2.0])],
        vec![("axis", AttrValue::Int(-1))],
    );
    one(
        9,
        "Slice",
        &[&[5, 6]],
        &[],
        vec![("starts", ints(&[1, -4])), ("ends", ints(&[100, -1]))],
    );
    one(
        13,
        "Slice",
        &[&[5, 6]],
        &[
            tv_i64(&[2], &[-1, 0]),
            tv_i64(&[2], &[-100, 6]),
            tv_i64(&[2], &[0, 1]),
            tv_i64(&[2], &[-2, 2]),
        ],
        vec![],
    );
    one(
        13,
        "Slice",
        &[&[5, 6]],
        &[tv_i64(&[1], &[3]), tv_i64(&[1], &[3]), tv_i64(&[1], &[1])],
        vec![],
    );
    one(13, "Expand", &[&[3, 1]], &[tv_i64(&[3], &[2, 1, 4])], vec![]);
    for (opset, attrs, extra) in [
        (11, vec![("axis", AttrValue::Int(1)), ("split", ints(&[2, 4]))], vec![]),
        (13, vec![("axis", AttrValue::Int(1))], vec![tv_i64(&[2], &[5, 1])]),
        (13, vec![("axis", AttrValue::Int(-1))], vec![]),
        (
            18,
            vec![("axis", AttrValue::Int(1)), ("num_outputs", AttrValue::Int(2))],
            vec![],
        ),
    ] {
        let mut d = D::new(opset);
        let x = d.input("x", 1, &[2, 6]);
        let mut ins = vec![x];
        for (i, t) in extra.iter().enumerate() {
            ins.push(d.init(&format!("s{i}"), t.clone()));
        }
        let refs: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
        let outs = d.nodes("Split", &refs, 2, attrs);
        for o in &outs {
            let r = d.node("Relu", &[o], vec![]);
            d.output(&r);
        }
        let inputs = random_inputs(&d, 3);
        check_and_run(&d, &inputs, 0.0);
    }
}

#[test]
fn gather_cast_where_shape_constants_dropout() {
    let mut d = D::new(13);
    let ids = d.input("ids", 7, &[2, 3]);
    let mask = d.input("mask", 9, &[2, 3]);
    let emb = d.f32s("emb", &[10, 4], 1);
    let e = d.node("Gather", &[&emb, &ids], vec![]);
    let ci = d.i64s("ci", &[2, -1]);
    let g2 = d.node("Gather", &[&e, &ci], vec![("axis", AttrValue::Int(2))]);
    let zero = d.node("Constant", &[], vec![("value", AttrValue::Tensor(tv_f32(&[], &[0.0])))]);
    let u = d.i64s("u", &[2]);
    let m = d.node("Unsqueeze", &[&mask, &u], vec![]);
    let w = d.node("Where", &[&m, &g2, &zero], vec![]);
    let f = d.node("Cast", &[&ids], vec![("to", AttrValue::Int(1))]);
    let bi = d.node("Cast", &[&f], vec![("to", AttrValue::Int(9))]);
    let back = d.node("Cast", &[&bi], vec![("to", AttrValue::Int(6))]);
    let sh = d.node("Shape", &[&e], vec![("start", AttrValue::Int(-2))]);
    let cs = d.node(
        "ConstantOfShape",
        &[&sh],
        vec![("value", AttrValue::Tensor(tv_f32(&[1], &[0.5])))],
    );
    let dr = d.nodes("Dropout", &[&w], 2, vec![]);
    let s = d.node("Add", &[&e, &cs], vec![]);
    for o in [&dr[0], &dr[1], &back, &sh, &s, &f] {
        d.output(o);
    }
    let inputs = random_inputs(&d, 10);
    check_and_run(&d, &inputs, 0.0);
    // Out-of-range runtime indices are an error, not a crash.
    let ir = import(&d.g, &d.consts).unwrap();
    let p = compile(&ir, Target::Generic).unwrap();
    let mut bad = inputs.clone();
    bad[0].v[0] = 10.0;
    let ins: Vec<Owned> = bad.iter().map(Owned::of).collect();
    let views: Vec<TensorRef<'_>> = ins.iter().map(Owned::view).collect();
    let mut outs: Vec<Owned> = p
        .outputs()
        .iter()
        .map(|s| Owned::zeros(s.elem_type, s.numel()))
        .collect();
    let mut ov: Vec<TensorMut<'_>> = outs.iter_mut().map(Owned::view_mut).collect();
    let e = p.run(Target::Generic, &views, &mut ov, &Serial).unwrap_err();
    assert!(e.message.contains("Gather index 10"), "{e}");
}

fn reasons(d: &D) -> Vec<std::result::Result<(), String>> {
    check_support(&d.g, &d.consts, &[])
}

#[test]
fn check_support_explains_refusals() {
    // A dynamic dim is fine (checked at probe sizes); an unknown rank is not.
    let mut d = D::new(13);
    let x = d.input("x", 1, &[-1, 768]);
    let r = d.node("Relu", &[&x], vec![]);
    d.output(&r);
    assert_eq!(reasons(&d), vec![Ok(())]);
    d.g.values.get_mut("x").unwrap().dims = None;
    let e = reasons(&d)[0].clone().unwrap_err();
    assert!(e.contains("unknown rank"), "{e}");

    let mut d = D::new(13);
    let x = d.input("x", 1, &[2, 3]);
    let s = d.node("Softmax", &[&x], vec![("axis", AttrValue::Int(5))]);
    d.output(&s);
    let e = reasons(&d)[0].clone().unwrap_err();
    assert!(e.contains("Softmax axis attribute 5 out of range"), "{e}");

    let mut d = D::new(13);
    let x = d.input("x", 1, &[2, 3]);
    let h = d.input("h", 11, &[2, 3]);
    let a = d.node("Add", &[&x, &h], vec![]);
    let r = d.node("Relu", &[&x], vec![]);
    d.output(&a);
    d.output(&r);
    let res = reasons(&d);
    assert!(res[0].clone().unwrap_err().contains("'h' is double"), "{res:?}");
    assert_eq!(res[1], Ok(()));
    let res = check_support(&d.g, &d.consts, &["Relu".to_string()]);
    assert!(res[1].clone().unwrap_err().contains("disabled"), "{res:?}");

    let mut d = D::new(13);
    let x = d.input("x", 1, &[2, 3]);
    let t = d.node("Tile", &[&x], vec![]);
    let r = d.node("Relu", &[&t], vec![]);
    d.g.nodes[1].domain = "com.microsoft".into();
    d.output(&r);
    let res = reasons(&d);
    assert!(res[0].clone().unwrap_err().contains("Tile"), "{res:?}");
    assert!(res[1].clone().unwrap_err().contains("com.microsoft"), "{res:?}");

    // A node after an unsupported one is fine when ORT typed the value.
    let mut d = D::new(13);
    let x = d.input("x", 1, &[2, 3]);
    let t = d.node("Tile", &[&x], vec![]);
    d.g.values.insert(t.clone(), ValueDesc::new(1, &[2, 3]));
    let r = d.node("Relu", &[&t], vec![]);
    d.output(&r);
    assert_eq!(reasons(&d)[1], Ok(()));
    // ... and refused when ORT's type disagrees with kiln's inference.
    let mut d = D::new(13);
    let x = d.input("x", 1, &[2, 3]);
    let r = d.node("Relu", &[&x], vec![]);
    d.g.values.insert(r.clone(), ValueDesc::new(1, &[3, 2]));
    d.output(&r);
    assert!(reasons(&d)[0].clone().unwrap_err().contains("ORT says"));
    // Non-constant shape inputs and non-adjacent reduce axes.
    let mut d = D::new(13);
    let x = d.input("x", 1, &[2, 3, 4]);
    let s = d.input("s", 7, &[2]);
    let r = d.node("Reshape", &[&x, &s], vec![]);
    let m = d.node("ReduceSum", &[&x], vec![("axes", ints(&[0, 2]))]);
    d.output(&r);
    d.output(&m);
    d.g.nodes[1].since_version = 11;
    let res = reasons(&d);
    assert!(res[0].clone().unwrap_err().contains("not a constant"), "{res:?}");
    assert!(res[1].clone().unwrap_err().contains("non-adjacent"), "{res:?}");
}

/// BERT's reshape of the hidden states into heads, computed the way
/// exporters write it: Shape → Gather → Unsqueeze → Concat → Reshape.
fn heads_reshape(d: &mut D, x: &str, heads: i64, head_dim: i64) -> String {
    let sh = d.node("Shape", &[x], vec![]);
    let i0 = d.init(&format!("i0_{x}"), tv_i64(&[], &[0]));
    let i1 = d.init(&format!("i1_{x}"), tv_i64(&[], &[1]));
    let b = d.node("Gather", &[&sh, &i0], vec![]);
    let s = d.node("Gather", &[&sh, &i1], vec![]);
    let ax = d.i64s(&format!("ax_{x}"), &[0]);
    let bu = d.node("Unsqueeze", &[&b, &ax], vec![]);
    let su = d.node("Unsqueeze", &[&s, &ax], vec![]);
    let hd = d.i64s(&format!("hd_{x}"), &[heads, head_dim]);
    let cat = d.node("Concat", &[&bu, &su, &hd], vec![("axis", AttrValue::Int(0))]);
    d.node("Reshape", &[x, &cat], vec![])
}

#[test]
fn shape_chains_fold_and_stay_supported() {
    let mut d = D::new(13);
    let x = d.input("x", 1, &[2, 5, 8]);
    let r = heads_reshape(&mut d, &x, 2, 4);
    let t = d.node("Transpose", &[&r], vec![("perm", ints(&[0, 2, 1, 3]))]);
    d.output(&t);
    let inputs = random_inputs(&d, 3);
    let p = check_and_run(&d, &inputs, 0.0);
    assert_eq!(p.num_steps(), 1, "only the transpose runs: {p:?}");
}

/// MLP: Gemm+Relu, MatMul+Add+Gelu(erf, decomposed), residual, MatMul+Add.
pub(crate) fn mlp() -> D {
    let mut d = D::new(13);
    let x = d.input("x", 1, &[8, 32]);
    let w1 = d.f32s("w1", &[64, 32], 1);
    let b1 = d.f32s("b1", &[64], 2);
    let h = d.node("Gemm", &[&x, &w1, &b1], vec![("transB", AttrValue::Int(1))]);
    let h = d.node("Relu", &[&h], vec![]);
    let w2 = d.f32s("w2", &[64, 32], 3);
    let b2 = d.f32s("b2", &[32], 4);
    let m = d.node("MatMul", &[&h, &w2], vec![]);
    let m = d.node("Add", &[&m, &b2], vec![]);
    let g = gelu_erf(&mut d, &m);
    let res = d.node("Add", &[&g, &x], vec![]);
    let w3 = d.f32s("w3", &[32, 10], 5);
    let b3 = d.f32s("b3", &[10], 6);
    let o = d.node("MatMul", &[&res, &w3], vec![]);
    let o = d.node("Add", &[&o, &b3], vec![]);
    d.output(&o);
    d
}

/// x·0.5·(1+erf(x/√2)) as PyTorch exports it.
fn gelu_erf(d: &mut D, x: &str) -> String {
    d.k += 1;
    let k = d.k;
    let sqrt2 = d.init(&format!("sqrt2_{k}"), tv_f32(&[], &[std::f32::consts::SQRT_2]));
    let one = d.init(&format!("one_{k}"), tv_f32(&[], &[1.0]));
    let half = d.init(&format!("half_{k}"), tv_f32(&[], &[0.5]));
    let dv = d.node("Div", &[x, &sqrt2], vec![]);
    let e = d.node("Erf", &[&dv], vec![]);
    let a = d.node("Add", &[&e, &one], vec![]);
    let m = d.node("Mul", &[x, &a], vec![]);
    d.node("Mul", &[&m, &half], vec![])
}

#[test]
fn mlp_end_to_end() {
    let d = mlp();
    let inputs = random_inputs(&d, 3);
    let p = check_and_run(&d, &inputs, 1e-5);
    assert_eq!(p.num_steps(), 3, "{}", p.op_summary());
    assert_eq!(p.packed_constants(), 3);
    assert_eq!(
        p.op_summary(),
        "MatMul+Bias+Relu x1, MatMul+Bias+Gelu+Residual x1, MatMul+Bias x1"
    );
    // Threads give the same answer.
    let named: HashMap<String, T> = d.g.inputs.iter().cloned().zip(inputs.iter().cloned()).collect();
    let want = reference::run(&d.g, &d.consts, &named);
    compare(&run_program(&p, &inputs, &ScopedThreads(2)), &want, 1e-5);
}

/// Options for the BERT-style encoder layer.
#[derive(Clone, Copy)]
pub(crate) struct Bert {
    pub mask: bool,
    pub fused_layernorm: bool,
}

/// One BERT encoder layer (hidden 32, 4 heads, FFN 64) over [2, 6] tokens,
/// with word and position embeddings in front, written as exporters write it.
pub(crate) fn bert_layer(opts: Bert) -> D {
    let (b, s, h, heads, ffn) = (2i64, 6i64, 32i64, 4i64, 64i64);
    let hd = h / heads;
    let mut d = D::new(17);
    let ids = d.input("input_ids", 7, &[b, s]);
    let emb = d.f32s("word_embeddings", &[50, h as usize], 1);
    let x = d.node("Gather", &[&emb, &ids], vec![]);
    // Position embeddings as HF exports them: a slice of a position-id
    // buffer as long as the sequence, gathered and added.
    // 64 positions: more than the sizes the support check probes unknown dims at.
    let pos_table = d.f32s("position_embeddings", &[64, h as usize], 2);
    let all_pos: Vec<i64> = (0..64).collect();
    let all_pos = d.init("position_ids", tv_i64(&[1, 64], &all_pos));
    let shape = d.node("Shape", &[&ids], vec![]);
    let seq_axis = d.i64s("seq_axis", &[1]);
    let seq = d.node("Gather", &[&shape, &seq_axis], vec![]);
    let (start, axis) = (d.i64s("pos_start", &[0]), d.i64s("pos_axis", &[1]));
    let pos = d.node("Slice", &[&all_pos, &start, &seq, &axis], vec![]);
    let pos = d.node("Gather", &[&pos_table, &pos], vec![]);
    let x = d.node("Add", &[&x, &pos], vec![]);
    let x = layer_norm(&mut d, &x, h as usize, opts.fused_layernorm, 10);
    let proj = |d: &mut D, x: &str, seed: usize| {
        let w = d.f32s(&format!("w{seed}"), &[h as usize, h as usize], seed);
        let bias = d.f32s(&format!("b{seed}"), &[h as usize], seed + 100);
        let m = d.node("MatMul", &[x, &w], vec![]);
        d.node("Add", &[&bias, &m], vec![])
    };
    let q = proj(&mut d, &x, 20);
    let k = proj(&mut d, &x, 21);
    let v = proj(&mut d, &x, 22);
    let split = |d: &mut D, t: &str, perm: &[i64]| {
        let r = heads_reshape(d, t, heads, hd);
        d.node("Transpose", &[&r], vec![("perm", ints(perm))])
    };
    let q = split(&mut d, &q, &[0, 2, 1, 3]);
    let kt = split(&mut d, &k, &[0, 2, 3, 1]);
    let v = split(&mut d, &v, &[0, 2, 1, 3]);
    let scores = d.node("MatMul", &[&q, &kt], vec![]);
    let scale = d.init("scale", tv_f32(&[], &[(hd as f32).sqrt()]));
    let mut scores = d.node("Div", &[&scores, &scale], vec![]);
    if opts.mask {
        // (1 - mask) * -10000 from an int64 mask, broadcast over heads and queries.
        let mask = d.input("attention_mask", 7, &[b, s]);
        let ax = d.i64s("mask_axes", &[1, 2]);
        let m = d.node("Unsqueeze", &[&mask, &ax], vec![]);
        let mf = d.node("Cast", &[&m], vec![("to", AttrValue::Int(1))]);
        let one = d.init("mask_one", tv_f32(&[], &[1.0]));
        let inv = d.node("Sub", &[&one, &mf], vec![]);
        let big = d.init("mask_big", tv_f32(&[], &[-10000.0]));
        let add = d.node("Mul", &[&inv, &big], vec![]);
        scores = d.node("Add", &[&scores, &add], vec![]);
    }
    let p = d.node("Softmax", &[&scores], vec![("axis", AttrValue::Int(-1))]);
    let ctx = d.node("MatMul", &[&p, &v], vec![]);
    let ctx = d.node("Transpose", &[&ctx], vec![("perm", ints(&[0, 2, 1, 3]))]);
    let shape = d.i64s("ctx_shape", &[0, 0, h]);
    let ctx = d.node("Reshape", &[&ctx, &shape], vec![]);
    let o = proj(&mut d, &ctx, 23);
    let o = d.node("Add", &[&o, &x], vec![]);
    let x2 = layer_norm(&mut d, &o, h as usize, opts.fused_layernorm, 11);
    let w1 = d.f32s("ffn_w1", &[h as usize, ffn as usize], 30);
    let b1 = d.f32s("ffn_b1", &[ffn as usize], 31);
    let f = d.node("MatMul", &[&x2, &w1], vec![]);
    let f = d.node("Add", &[&f, &b1], vec![]);
    let f = gelu_erf(&mut d, &f);
    let w2 = d.f32s("ffn_w2", &[ffn as usize, h as usize], 32);
    let b2 = d.f32s("ffn_b2", &[h as usize], 33);
    let f = d.node("MatMul", &[&f, &w2], vec![]);
    let f = d.node("Add", &[&f, &b2], vec![]);
    let f = d.node("Add", &[&f, &x2], vec![]);
    let y = layer_norm(&mut d, &f, h as usize, opts.fused_layernorm, 12);
    d.output(&y);
    d
}

fn layer_norm(d: &mut D, x: &str, h: usize, fused: bool, seed: usize) -> String {
    let g = d.f32s(&format!("ln_g{seed}"), &[h], seed);
    let b = d.f32s(&format!("ln_b{seed}"), &[h], seed + 50);
    if fused {
        return d.node(
            "LayerNormalization",
            &[x, &g, &b],
            vec![("epsilon", AttrValue::Float(1e-12))],
        );
    }
    let axes = || vec![("axes", ints(&[-1]))];
    // Opset 17 ReduceMean still takes axes as an attribute.
    let mu = d.node("ReduceMean", &[x], axes());
    let dv = d.node("Sub", &[x, &mu], vec![]);
    let two = d.init(&format!("two{seed}"), tv_f32(&[], &[2.0]));
    let p = d.node("Pow", &[&dv, &two], vec![]);
    let var = d.node("ReduceMean", &[&p], axes());
    let eps = d.init(&format!("eps{seed}"), tv_f32(&[], &[1e-12]));
    let ve = d.node("Add", &[&var, &eps], vec![]);
    let sd = d.node("Sqrt", &[&ve], vec![]);
    let n = d.node("Div", &[&dv, &sd], vec![]);
    let m = d.node("Mul", &[&n, &g], vec![]);
    d.node("Add", &[&m, &b], vec![])
}

#[test]
fn bert_layer_end_to_end() {
    for (mask, fused) in [(true, false), (false, true), (true, true)] {
        let d = bert_layer(Bert {
            mask,
            fused_layernorm: fused,
        });
        let inputs = random_inputs(&d, 50);
        let p = check_and_run(&d, &inputs, 2e-5);
        let summary = p.op_summary();
        // The embeddings' sum and norm are one op (issue #14).
        assert!(summary.contains("LayerNormalization x2"), "{summary}");
        assert!(summary.contains("EmbedLayerNormalization(2 terms) x1"), "{summary}");
        assert!(!summary.contains("Gather") && !summary.contains("Add "), "{summary}");
        assert!(
            summary.contains("Gelu+Residual") || summary.contains("Gelu"),
            "{summary}"
        );
        assert!(!summary.contains("Erf") && !summary.contains("Pow"), "{summary}");
        assert_eq!(p.packed_constants(), 6, "{summary}");
        // Scores, scale, mask, softmax and the product with V are one
        // fused attention (issue #14).
        // Q, K and V's projections are one product the attention reads packed.
        let attention = if mask {
            "Attention(QKV)+Mask x1"
        } else {
            "Attention(QKV) x1"
        };
        assert!(summary.contains(attention), "{summary}");
        assert!(summary.contains("MatMul(3 weights)+Bias x1"), "{summary}");
        assert!(
            !summary.contains("Softmax") && !summary.contains("MatMul+Scale"),
            "{summary}"
        );
        assert!(summary.contains("MatMul+Bias+Gelu x1"), "{summary}");
    }
}

#[test]
fn a_slice_keeping_every_element_is_no_step() {
    // jax2tf's `x[:, :, :]`: ends past the dims, one axis not listed.
    for (ends, steps) in [([i64::MAX, 6], 1), ([4, 6], 1), ([-100, -100], -1)] {
        let mut d = D::new(13);
        let x = d.input("x", 1, &[4, 6, 3]);
        let starts = d.i64s("starts", if steps == 1 { &[0, 0] } else { &[100, 100] });
        let ends = d.i64s("ends", &ends);
        let axes = d.i64s("axes", &[0, 1]);
        let step = d.i64s("steps", &[steps, steps]);
        let s = d.node("Slice", &[&x, &starts, &ends, &axes, &step], vec![]);
        let y = d.node("Relu", &[&s], vec![]);
        d.output(&y);
        let inputs = random_inputs(&d, 5);
        let p = check_and_run(&d, &inputs, 0.0);
        let kinds: Vec<String> = p.steps().iter().map(|s| s.kind()).collect();
        // A reversing slice keeps every element too, but not in order.
        let want = if steps == 1 {
            vec!["Relu"]
        } else {
            vec!["StridedCopy", "Relu"]
        };
        assert_eq!(kinds, want, "ends {ends:?} steps {steps}");
    }
}

#[test]
fn a_large_constant_of_shape_runs_as_an_expand() {
    // Too large to fold into a constant: kiln expands the value at run time.
    let mut d = D::new(17);
    let x = d.input("x", 1, &[1100, 1000]);
    let shape = d.i64s("shape", &[1100, 1000]);
    let c = d.node(
        "ConstantOfShape",
        &[&shape],
        vec![("value", AttrValue::Tensor(tv_f32(&[1], &[0.5])))],
    );
    let y = d.node("Add", &[&x, &c], vec![]);
    d.output(&y);
    let inputs = random_inputs(&d, 10);
    let p = check_and_run(&d, &inputs, 0.0);
    assert!(
        p.constant_bytes() < 1024,
        "the 4.4 MB constant was folded: {}",
        p.constant_bytes()
    );
}

#[test]
fn a_subset_keeps_its_nodes_and_the_types_they_touch() {
    let mut d = D::new(17);
    let x = d.input("x", 1, &[2, 3]);
    let r = d.node("Relu", &[&x], vec![]);
    let t = d.node("Tanh", &[&r], vec![]);
    let s = d.node("Sigmoid", &[&t], vec![]);
    d.g.values.insert(t.clone(), ValueDesc::new(1, &[2, 3]));
    let sub = d.g.subset(&[1]);
    assert_eq!(sub.nodes.len(), 1);
    assert_eq!(sub.nodes[0].op_type, "Tanh");
    let mut names: Vec<&String> = sub.values.keys().collect();
    names.sort();
    assert_eq!(names, vec![&t], "only Tanh's typed values: not x, not {s}");
    assert_eq!(
        check_support(&sub, &d.consts, &[]),
        vec![Err("'Relu_1_0' has no type information".into())]
    );
}

#[test]
fn a_node_valid_only_at_strided_sizes_is_checked_at_multiples_of_32() {
    // A detector's levels only line up when the strides divide the image
    // size; a Reshape into rows of 32 stands for that here.
    let at = |row: i64| {
        let mut d = D::new(13);
        let x = d.input("x", 1, &[1, -1]);
        let shape = d.i64s("shape", &[1, -1, row]);
        let r = d.node("Reshape", &[&x, &shape], vec![]);
        d.output(&r);
        reasons(&d).remove(0)
    };
    assert_eq!(at(32), Ok(()));
    assert_eq!(at(16), Ok(()));
    // No multiple of 32 is a multiple of 7 by design (the sizes are 32 × primes ≥ 17).
    let e = at(7).unwrap_err();
    assert!(e.contains("cannot reshape"), "{e}");
}
