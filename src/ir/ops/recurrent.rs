//! Recurrent layers: LSTM and GRU (opsets 7, 14 and 22 alike: `layout`
//! defaults to 0), every direction, initial states, `sequence_lens`, `clip`,
//! the activations ONNX allows, LSTM's `input_forget` and peepholes, GRU's
//! `linear_before_reset`.
//!
//! One IR op ([`Op::Rnn`]) computes all outputs into one flat buffer; each
//! ONNX output the node has is a slice of it. `W`, `R` and `B` must be
//! constants: `W` and `R` are packed for the GEMM at compile time, and the
//! biases are folded into one row added to the input projections. `layout = 1`
//! (batch first, which ORT's CPU EP refuses) is imported as transposes around
//! the `layout = 0` computation.

use super::attrs::{attr, attr_float, attr_int, attr_str};
use super::OpFamily;
use crate::ir::desc::{AttrValue, NodeDesc};
use crate::ir::import::{Importer, Why};
use crate::ir::{DType, Op, RnnActivation, RnnAttrs, RnnCell, RnnDirection, RnnInputs, RnnSpec, Tensor, ValueId};
use crate::kernels::recurrent::RnnDims;

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(&["LSTM"], lstm).multi_output().optional_outputs(),
    OpFamily::new(&["GRU"], gru).multi_output().optional_outputs(),
];

fn lstm(imp: &mut Importer, n: &NodeDesc, _out: &str) -> Result<(), Why> {
    let cell = RnnCell::Lstm {
        input_forget: attr_int(n, "input_forget", 0)? != 0,
        peepholes: present(n, 7),
    };
    rnn(imp, n, cell)
}

fn gru(imp: &mut Importer, n: &NodeDesc, _out: &str) -> Result<(), Why> {
    let lbr = attr_int(n, "linear_before_reset", 0)?;
    if !matches!(lbr, 0 | 1) {
        return Err(format!("linear_before_reset {lbr} is not 0 or 1"));
    }
    rnn(
        imp,
        n,
        RnnCell::Gru {
            linear_before_reset: lbr == 1,
        },
    )
}

fn present(n: &NodeDesc, k: usize) -> bool {
    n.inputs.get(k).is_some_and(|s| !s.is_empty())
}

fn output(n: &NodeDesc, k: usize) -> Option<&str> {
    n.outputs.get(k).map(String::as_str).filter(|s| !s.is_empty())
}

/// The node's attributes as a [`RnnSpec`].
fn spec_of(n: &NodeDesc, cell: RnnCell) -> Result<RnnSpec, Why> {
    let hidden = attr_int(n, "hidden_size", 0)?;
    let hidden = usize::try_from(hidden)
        .ok()
        .filter(|&h| h > 0)
        .ok_or_else(|| format!("hidden_size {hidden} is not positive (or missing)"))?;
    let direction = match attr_str(n, "direction", "forward")? {
        "forward" => RnnDirection::Forward,
        "reverse" => RnnDirection::Reverse,
        "bidirectional" => RnnDirection::Bidirectional,
        other => return Err(format!("direction '{other}' is not forward, reverse or bidirectional")),
    };
    let clip = match attr(n, "clip") {
        None => None,
        Some(_) => {
            let c = attr_float(n, "clip", 0.0)?;
            if c.is_nan() || c < 0.0 {
                return Err(format!("clip {c} is negative"));
            }
            Some(c)
        }
    };
    Ok(RnnSpec {
        cell,
        direction,
        hidden,
        activations: activations(n, cell, direction.count())?,
        clip,
    })
}

/// `activations` with `activation_alpha` / `activation_beta` consumed in
/// order by the functions that take them, as ORT does. Defaults are ORT's
/// (measured against ORT 1.31.1): LeakyRelu 0.01, HardSigmoid 0.2 / 0.5,
/// Elu 1.0, and 0 for Affine, ThresholdedRelu and ScaledTanh.
fn activations(n: &NodeDesc, cell: RnnCell, dirs: usize) -> Result<Vec<RnnActivation>, Why> {
    let per = cell.activations();
    let names: Vec<String> = match attr(n, "activations") {
        None => match cell {
            RnnCell::Lstm { .. } => ["Sigmoid", "Tanh", "Tanh"].repeat(dirs),
            RnnCell::Gru { .. } => ["Sigmoid", "Tanh"].repeat(dirs),
        }
        .into_iter()
        .map(String::from)
        .collect(),
        Some(AttrValue::Strings(v)) => v.clone(),
        Some(other) => return Err(format!("attribute activations is {other:?}, expected strings")),
    };
    if names.len() != per * dirs {
        return Err(format!(
            "{} activations given; {} takes {per} per direction, {} in all",
            names.len(),
            cell.onnx_name(),
            per * dirs
        ));
    }
    let floats = |name: &str| match attr(n, name) {
        None => Ok(Vec::new()),
        Some(AttrValue::Floats(v)) => Ok(v.clone()),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected floats")),
    };
    let (alphas, betas) = (floats("activation_alpha")?, floats("activation_beta")?);
    let (mut alphas, mut betas) = (alphas.into_iter(), betas.into_iter());
    names
        .iter()
        .map(|name| {
            let mut alpha = |default: f32| alphas.next().unwrap_or(default);
            let f = match name.to_ascii_lowercase().as_str() {
                "sigmoid" => RnnActivation::Sigmoid,
                "tanh" => RnnActivation::Tanh,
                "relu" => RnnActivation::Relu,
                "affine" => RnnActivation::Affine(alpha(0.0), betas.next().unwrap_or(0.0)),
                "leakyrelu" => RnnActivation::LeakyRelu(alpha(0.01)),
                "thresholdedrelu" => RnnActivation::ThresholdedRelu(alpha(0.0)),
                "scaledtanh" => RnnActivation::ScaledTanh(alpha(0.0), betas.next().unwrap_or(0.0)),
                "hardsigmoid" => RnnActivation::HardSigmoid(alpha(0.2), betas.next().unwrap_or(0.5)),
                "elu" => RnnActivation::Elu(alpha(1.0)),
                "softsign" => RnnActivation::Softsign,
                "softplus" => RnnActivation::Softplus,
                _ => {
                    return Err(format!(
                        "activation '{name}' is not one ONNX allows in {}",
                        cell.onnx_name()
                    ))
                }
            };
            Ok(f)
        })
        .collect()
}

fn rnn(imp: &mut Importer, n: &NodeDesc, cell: RnnCell) -> Result<(), Why> {
    let spec = spec_of(n, cell)?;
    let layout = attr_int(n, "layout", 0)?;
    if !matches!(layout, 0 | 1) {
        return Err(format!("layout {layout} is not 0 or 1"));
    }
    let is_lstm = matches!(cell, RnnCell::Lstm { .. });
    for (k, name) in n.outputs.iter().enumerate() {
        if k >= if is_lstm { 3 } else { 2 } && !name.is_empty() {
            return Err(format!("{} has no output {k}", cell.onnx_name()));
        }
    }
    let (dirs, h) = (spec.direction.count(), spec.hidden);
    let gh = cell.gates() * h;
    let w = imp.input(n, 1)?;
    let r = imp.input(n, 2)?;
    for (id, what) in [(w, "W"), (r, "R")] {
        if !imp.is_constant(id) {
            return Err(format!("{what} is not a constant (kiln packs it at compile time)"));
        }
        if imp.ty(id).dtype != DType::F32 {
            return Err(format!("{what} is {}", imp.ty(id).dtype));
        }
    }
    let input = match imp.ty(w).shape[..] {
        [d, g, i] if d == dirs && g == gh => i,
        _ => {
            return Err(format!(
                "W {:?} is not [{dirs}, {gh}, input_size] ({dirs} direction(s), hidden_size {h})",
                imp.ty(w).shape
            ))
        }
    };
    if imp.ty(r).shape != [dirs, gh, h] {
        return Err(format!("R {:?} is not [{dirs}, {gh}, {h}]", imp.ty(r).shape));
    }
    // X as [seq, batch, input].
    let x = if layout == 0 {
        imp.input_shaped(n, 0, &[None, None, Some(input)])?
    } else {
        let xb = imp.input_shaped(n, 0, &[None, None, Some(input)])?;
        transpose(imp, n, xb, &[1, 0, 2])?
    };
    expect_f32(imp, x, "X")?;
    let [seq, batch, xin] = imp.ty(x).shape[..] else {
        return Err(format!("X {:?} is not 3-D", imp.ty(x).shape));
    };
    if xin != input {
        return Err(format!("X has input size {xin} but W {input}"));
    }
    let mut ins = vec![x, w, r];
    let mut has = RnnInputs::default();
    if present(n, 3) {
        let (bias, rbh) = biases(imp, n, cell, dirs, h)?;
        ins.push(bias);
        has.bias = true;
        if let Some(rbh) = rbh {
            ins.push(rbh);
            has.rbh = true;
        }
    } else if cell
        == (RnnCell::Gru {
            linear_before_reset: true,
        })
    {
        // Rbh is zero: the kernel still takes it.
        ins.push(imp.constant("rnn_rbh", Tensor::f32(&[dirs * h], vec![0.0; dirs * h])));
        has.rbh = true;
    }
    if present(n, 4) {
        let sl = imp.input_shaped(n, 4, &[Some(batch)])?;
        if imp.ty(sl).dtype != DType::I32 || imp.ty(sl).shape != [batch] {
            return Err(format!("sequence_lens is {}, expected int32[{batch}]", imp.ty(sl)));
        }
        ins.push(sl);
        has.seq_lens = true;
    }
    let state = |imp: &mut Importer, k: usize, what: &str| -> Result<ValueId, Why> {
        let v = if layout == 0 {
            imp.input_shaped(n, k, &[Some(dirs), Some(batch), Some(h)])?
        } else {
            let vb = imp.input_shaped(n, k, &[Some(batch), Some(dirs), Some(h)])?;
            transpose(imp, n, vb, &[1, 0, 2])?
        };
        expect_f32(imp, v, what)?;
        if imp.ty(v).shape != [dirs, batch, h] {
            return Err(format!(
                "{what} {:?} does not fit [{dirs}, {batch}, {h}]",
                imp.ty(v).shape
            ));
        }
        Ok(v)
    };
    if present(n, 5) {
        ins.push(state(imp, 5, "initial_h")?);
        has.initial_h = true;
    }
    if is_lstm && present(n, 6) {
        ins.push(state(imp, 6, "initial_c")?);
        has.initial_c = true;
    }
    if is_lstm && present(n, 7) {
        let p = imp.input(n, 7)?;
        expect_f32(imp, p, "P")?;
        if imp.ty(p).shape != [dirs, 3 * h] {
            return Err(format!("P {:?} is not [{dirs}, {}]", imp.ty(p).shape, 3 * h));
        }
        let flat = imp.emit(n, Op::Reshape, &[p], None, Some(&[dirs * 3 * h]))?;
        ins.push(flat);
        has.p = true;
    }
    let all = imp.emit(
        n,
        Op::Rnn(Box::new(RnnAttrs {
            spec: spec.clone(),
            has,
        })),
        &ins,
        None,
        None,
    )?;
    let dims = RnnDims { seq, batch, input };
    let offsets = dims.output_offsets(&spec).ok_or("the layer's output is too large")?;
    let state_shape = [dirs, batch, h];
    let y_shape = [seq, dirs, batch, h];
    let outputs: [(&[usize], &[usize]); 3] = [
        (&y_shape, &[2, 0, 1, 3]),
        (&state_shape, &[1, 0, 2]),
        (&state_shape, &[1, 0, 2]),
    ];
    for (k, (shape, batch_first)) in outputs.iter().enumerate() {
        let Some(name) = output(n, k) else { continue };
        let len: usize = shape.iter().product();
        let part = imp.emit(
            n,
            Op::Slice {
                starts: vec![offsets[k]],
                steps: vec![1],
            },
            &[all],
            None,
            Some(&[len]),
        )?;
        if layout == 0 {
            imp.emit(n, Op::Reshape, &[part], Some(name), Some(shape))?;
        } else {
            let v = imp.emit(n, Op::Reshape, &[part], None, Some(shape))?;
            let perm: Vec<usize> = batch_first.to_vec();
            imp.emit(n, Op::Transpose { perm }, &[v], Some(name), None)?;
        }
    }
    Ok(())
}

fn transpose(imp: &mut Importer, n: &NodeDesc, v: ValueId, perm: &[usize]) -> Result<ValueId, Why> {
    if imp.ty(v).shape.len() != perm.len() {
        return Err(format!("{:?} is not {}-D", imp.ty(v).shape, perm.len()));
    }
    imp.emit(n, Op::Transpose { perm: perm.to_vec() }, &[v], None, None)
}

fn expect_f32(imp: &Importer, v: ValueId, what: &str) -> Result<(), Why> {
    match imp.ty(v).dtype {
        DType::F32 => Ok(()),
        other => Err(format!("{what} is {other}; kiln runs recurrent layers on float32")),
    }
}

/// `B [dirs, 2 * gates * hidden]` (`Wb` then `Rb`) as the row added to the
/// input projections, and GRU's `Rbh` apart when `linear_before_reset`
/// (it is multiplied by `r`).
fn biases(
    imp: &mut Importer,
    n: &NodeDesc,
    cell: RnnCell,
    dirs: usize,
    h: usize,
) -> Result<(ValueId, Option<ValueId>), Why> {
    let gh = cell.gates() * h;
    let b = imp.input(n, 3)?;
    if imp.ty(b).shape != [dirs, 2 * gh] {
        return Err(format!("B {:?} is not [{dirs}, {}]", imp.ty(b).shape, 2 * gh));
    }
    expect_f32(imp, b, "B")?;
    let t = imp
        .known(b, true)?
        .ok_or("B is not a constant (kiln folds it into the input projections)")?;
    let vals = t.as_f64s();
    let lbr = cell
        == (RnnCell::Gru {
            linear_before_reset: true,
        });
    let mut row = Vec::with_capacity(dirs * gh);
    let mut rbh = Vec::with_capacity(dirs * h);
    for d in 0..dirs {
        let wb = &vals[d * 2 * gh..d * 2 * gh + gh];
        let rb = &vals[d * 2 * gh + gh..(d + 1) * 2 * gh];
        for j in 0..gh {
            let separate = lbr && j >= 2 * h;
            row.push(if separate {
                wb[j] as f32
            } else {
                (wb[j] as f32) + (rb[j] as f32)
            });
        }
        if lbr {
            rbh.extend(rb[2 * h..].iter().map(|&v| v as f32));
        }
    }
    let bias = imp.constant("rnn_bias", Tensor::f32(&[dirs * gh], row));
    let rbh = lbr.then(|| imp.constant("rnn_rbh", Tensor::f32(&[dirs * h], rbh)));
    Ok((bias, rbh))
}
