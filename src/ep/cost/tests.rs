use std::collections::HashMap;

use super::*;
use crate::ir::{TensorValue, ValueDesc};

fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeDesc {
    NodeDesc {
        name: outputs[0].to_string(),
        domain: String::new(),
        op_type: op.to_string(),
        since_version: 17,
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        attrs: Default::default(),
    }
}

fn graph(nodes: Vec<NodeDesc>, values: &[(&str, &[i64])]) -> GraphDesc {
    GraphDesc {
        nodes,
        values: values
            .iter()
            .map(|(n, d)| (n.to_string(), ValueDesc::new(1, d)))
            .collect(),
        ..Default::default()
    }
}

fn weights(names: &[&str]) -> HashMap<String, TensorValue> {
    let empty = TensorValue {
        elem_type: 1,
        shape: vec![],
        bytes: vec![],
    };
    names.iter().map(|n| (n.to_string(), empty.clone())).collect()
}

fn reasons(out: &[(usize, String)]) -> Vec<usize> {
    out.iter().map(|(i, _)| *i).collect()
}

#[test]
fn a_matmul_over_a_symbolic_sequence_is_an_anchor() {
    let g = graph(
        vec![node("MatMul", &["x", "w"], &["y"]), node("Relu", &["y"], &["z"])],
        &[("x", &[-1, -1, 256]), ("w", &[256, 256])],
    );
    let c = weights(&["w"]);
    let mut rule = CostRule::new(&g, &c, &[], Target::Avx512);
    assert!(rule.judge(&[vec![0, 1]], &[true, true]).is_empty());
}

#[test]
fn a_batch_only_gemv_or_a_small_weight_is_not_an_anchor() {
    let cases = [
        (&[-1i64, 256][..], &[256i64, 256][..]),
        (&[64, 16][..], &[16, 16][..]),
        (&[1, 2048, 257][..], &[257, 64][..]),
    ];
    for (x, w) in cases {
        let g = graph(vec![node("MatMul", &["x", "w"], &["y"])], &[("x", x), ("w", w)]);
        let c = weights(&["w"]);
        let mut rule = CostRule::new(&g, &c, &[], Target::Avx512);
        let out = rule.judge(&[vec![0]], &[true]);
        assert_eq!(reasons(&out), vec![0], "x {x:?} w {w:?}");
        assert!(out[0].1.contains("no work kiln runs faster"), "{}", out[0].1);
    }
}

#[test]
fn a_one_row_product_with_a_huge_weight_is_an_anchor() {
    let g = graph(
        vec![node("Gemm", &["x", "w"], &["y"])],
        &[("x", &[1, 4096]), ("w", &[4096, 4096])],
    );
    let c = weights(&["w"]);
    let mut rule = CostRule::new(&g, &c, &[], Target::Avx512);
    assert!(rule.judge(&[vec![0]], &[true]).is_empty());
}

#[test]
fn a_weight_computed_from_constants_counts_as_constant() {
    let g = graph(
        vec![node("Transpose", &["wt"], &["w"]), node("MatMul", &["x", "w"], &["y"])],
        &[("x", &[32, 256]), ("w", &[256, 256])],
    );
    let c = weights(&["wt"]);
    let mut rule = CostRule::new(&g, &c, &[], Target::Avx512);
    assert!(rule.judge(&[vec![0, 1]], &[true, true]).is_empty());
}

#[test]
fn a_matmul_of_two_runtime_operands_is_not_an_anchor() {
    let g = graph(
        vec![node("MatMul", &["x", "w"], &["y"])],
        &[("x", &[64, 256]), ("w", &[256, 256])],
    );
    let mut rule = CostRule::new(&g, &crate::ir::NO_CONSTANTS, &[], Target::Avx512);
    assert_eq!(reasons(&rule.judge(&[vec![0]], &[true])), vec![0]);
}

#[test]
fn elementwise_partitions_go_to_ort_unless_forced() {
    let g = graph(
        vec![node("Add", &["x", "x"], &["y"]), node("Floor", &["y"], &["z"])],
        &[("x", &[4, 4])],
    );
    let mut rule = CostRule::new(&g, &crate::ir::NO_CONSTANTS, &[], Target::Avx512);
    assert_eq!(reasons(&rule.judge(&[vec![0, 1]], &[true, true])), vec![0, 1]);
    let forced = ["Floor".to_string()];
    let mut rule = CostRule::new(&g, &crate::ir::NO_CONSTANTS, &forced, Target::Avx512);
    assert!(rule.judge(&[vec![0, 1]], &[true, true]).is_empty());
}

#[test]
fn activations_after_an_ort_conv_chain_stay_with_ort() {
    // Conv (ORT) -> Add(bias) -> Relu -> MatMul (an anchor).
    let g = graph(
        vec![
            node("Conv", &["x", "k"], &["c"]),
            node("Add", &["c", "b"], &["a"]),
            node("Relu", &["a"], &["r"]),
            node("MatMul", &["r", "w"], &["y"]),
        ],
        &[("r", &[1, 64, 128]), ("w", &[128, 128])],
    );
    let c = weights(&["k", "b", "w"]);
    let mut rule = CostRule::new(&g, &c, &[], Target::Avx512);
    let mut claimed = vec![false, true, true, true];
    let first = rule.judge(&[vec![1, 2, 3]], &claimed);
    assert_eq!(reasons(&first), vec![1]);
    assert!(first[0].1.contains("fuses it into the Conv"), "{}", first[0].1);
    claimed[1] = false;
    assert_eq!(reasons(&rule.judge(&[vec![2, 3]], &claimed)), vec![2]);
    claimed[2] = false;
    assert!(rule.judge(&[vec![3]], &claimed).is_empty());
}

#[test]
fn an_activation_whose_producer_has_other_consumers_is_kept() {
    let g = graph(
        vec![
            node("Conv", &["x", "k"], &["c"]),
            node("Relu", &["c"], &["r"]),
            node("MatMul", &["r", "w"], &["y"]),
            node("Identity", &["c"], &["d"]),
        ],
        &[("r", &[1, 64, 128]), ("w", &[128, 128])],
    );
    let c = weights(&["k", "w"]);
    let mut rule = CostRule::new(&g, &c, &[], Target::Avx512);
    assert!(rule.judge(&[vec![1, 2]], &[false, true, true, false]).is_empty());
}

#[test]
fn quantize_dequantize_groups_stay_with_ort() {
    let g = graph(
        vec![
            node("DequantizeLinear", &["q", "s", "z"], &["x"]),
            node("MatMul", &["x", "w"], &["y"]),
            node("Relu", &["y"], &["r"]),
            node("QuantizeLinear", &["r", "s", "z"], &["o"]),
            node("Sigmoid", &["y"], &["t"]),
        ],
        &[],
    );
    let rule = CostRule::new(&g, &crate::ir::NO_CONSTANTS, &[], Target::Avx512);
    let left: Vec<usize> = (0..5).filter(|&i| rule.quantized(i).is_some()).collect();
    assert_eq!(left, vec![1, 2]);
    assert!(rule.quantized(1).unwrap().contains("quantize/dequantize group"));
    let forced = ["MatMul".to_string()];
    assert!(CostRule::new(&g, &crate::ir::NO_CONSTANTS, &forced, Target::Avx512)
        .quantized(1)
        .is_none());
}

#[test]
fn convolutions_stay_with_ort_unless_forced() {
    let g = graph(
        vec![node("Conv", &["x", "w"], &["y"]), node("MatMul", &["y", "m"], &["z"])],
        &[
            ("x", &[-1, 256, 16, 16]),
            ("w", &[256, 256, 1, 1]),
            ("y", &[-1, 256, 16, 16]),
            ("m", &[16, 256]),
        ],
    );
    let c = weights(&["w", "m"]);
    let out = CostRule::new(&g, &c, &[], Target::Avx512).judge(&[vec![0, 1]], &[true, true]);
    assert_eq!(reasons(&out), [0]);
    assert!(out[0].1.contains("force_ops=Conv"), "{}", out[0].1);
    let forced = ["Conv".to_string()];
    assert!(CostRule::new(&g, &c, &forced, Target::Avx512)
        .judge(&[vec![0, 1]], &[true, true])
        .is_empty());
}

/// `n` convolutions in a chain, each followed by `act` (the nodes it adds
/// after `Conv k`, reading `c{k}` and writing `a{k}`); weights `w{k}`.
fn conv_chain(n: usize, act: fn(usize) -> Vec<NodeDesc>) -> (GraphDesc, HashMap<String, TensorValue>) {
    let mut nodes = Vec::new();
    let mut names = Vec::new();
    for k in 0..n {
        let x = if k == 0 { "x".to_string() } else { format!("a{}", k - 1) };
        nodes.push(node("Conv", &[&x, &format!("w{k}")], &[&format!("c{k}")]));
        nodes.extend(act(k));
        names.push(format!("w{k}"));
    }
    names.extend(["three", "six", "zero", "s", "b"].map(String::from));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    (graph(nodes, &[("x", &[-1, 16, -1, -1])]), weights(&refs))
}

fn silu(k: usize) -> Vec<NodeDesc> {
    let (c, g, a) = (format!("c{k}"), format!("g{k}"), format!("a{k}"));
    vec![node("Sigmoid", &[&c], &[&g]), node("Mul", &[&c, &g], &[&a])]
}

/// PP-LCNet's: a learnable scale and shift (constant first), then HardSwish
/// as `x · Clip(x + 3, 0, 6) / 6`.
fn lcnet_hardswish(k: usize) -> Vec<NodeDesc> {
    let n = |s: &str| format!("{s}{k}");
    vec![
        node("Mul", &["s", &n("c")], &[&n("m")]),
        node("Add", &[&n("m"), "b"], &[&n("v")]),
        node("Add", &[&n("v"), "three"], &[&n("p")]),
        node("Clip", &[&n("p"), "zero", "six"], &[&n("q")]),
        node("Mul", &[&n("v"), &n("q")], &[&n("r")]),
        node("Div", &[&n("r"), "six"], &[&n("a")]),
    ]
}

fn relu(k: usize) -> Vec<NodeDesc> {
    vec![node("Relu", &[&format!("c{k}")], &[&format!("a{k}")])]
}

/// The rule's verdicts with the whole graph as one partition.
fn judge_whole(g: &GraphDesc, c: &HashMap<String, TensorValue>) -> Vec<(usize, String)> {
    let all: Vec<usize> = (0..g.nodes.len()).collect();
    CostRule::new(g, c, &[], Target::Avx512).judge(&[all], &vec![true; g.nodes.len()])
}

#[test]
fn gated_convolutions_are_claimed() {
    for act in [silu as fn(usize) -> Vec<NodeDesc>, lcnet_hardswish] {
        let (g, c) = conv_chain(4, act);
        let out = judge_whole(&g, &c);
        assert!(out.is_empty(), "{out:?}");
    }
}

#[test]
fn relu_convolutions_few_gates_or_many_pieces_stay_with_ort() {
    // ORT fuses a Relu into its convolution as well as kiln does.
    let (g, c) = conv_chain(4, relu);
    let out = judge_whole(&g, &c);
    assert_eq!(reasons(&out), [0, 2, 4, 6]);
    assert!(out[0].1.contains("where ORT fuses their activations"), "{}", out[0].1);
    // Three gated convolutions are too few to count.
    let (g, c) = conv_chain(3, silu);
    assert_eq!(reasons(&judge_whole(&g, &c)), [0, 3, 6]);
    // A gated network cut into three partitions pays transposes at each cut.
    let (g, c) = conv_chain(6, silu);
    let parts = [
        vec![0, 1, 2, 3, 4, 5],
        vec![6, 7, 8, 9, 10, 11],
        vec![12, 13, 14, 15, 16, 17],
    ];
    let out = CostRule::new(&g, &c, &[], Target::Avx512).judge(&parts, &[true; 18]);
    assert_eq!(reasons(&out), [0, 3, 6, 9, 12, 15]);
    assert!(out[0].1.contains("more than 2 partitions"), "{}", out[0].1);
}

/// A gate as one op, which ORT fuses into its convolution.
fn hardswish(k: usize) -> Vec<NodeDesc> {
    vec![node("HardSwish", &[&format!("c{k}")], &[&format!("a{k}")])]
}

/// The convolutions of `g` the rule leaves to ORT on `target`, with the
/// first one's reason.
fn convs_left(g: &GraphDesc, c: &HashMap<String, TensorValue>, target: Target) -> (Vec<usize>, Vec<usize>, String) {
    let all: Vec<usize> = (0..g.nodes.len()).collect();
    let convs: Vec<usize> = all.iter().copied().filter(|&i| g.nodes[i].op_type == "Conv").collect();
    let out = CostRule::new(g, c, &[], target).judge(std::slice::from_ref(&all), &vec![true; g.nodes.len()]);
    let left: Vec<usize> = reasons(&out).into_iter().filter(|i| convs.contains(i)).collect();
    let why = out
        .iter()
        .find(|(i, _)| convs.contains(i))
        .map_or(String::new(), |(_, w)| w.clone());
    (convs, left, why)
}

#[test]
fn gates_count_by_target() {
    // AVX2: products x·f(x), which ORT runs as passes of their own, make a
    // gated network (YOLOv8n, PP-OCR: 0.57-0.87x the CPU EP on a Zen 3).
    for act in [silu as fn(usize) -> Vec<NodeDesc>, lcnet_hardswish] {
        let (g, c) = conv_chain(4, act);
        let (_, left, why) = convs_left(&g, &c, Target::Avx2);
        assert!(left.is_empty(), "{left:?}: {why}");
    }
    // A HardSwish op ORT fuses into its convolution: with the AVX2
    // kernels PP-LCNet ran at 1.00-1.05x, so only AVX-512 counts it.
    let (g, c) = conv_chain(4, hardswish);
    let (convs, left, why) = convs_left(&g, &c, Target::Avx2);
    assert_eq!(left, convs);
    assert!(
        why.contains("where ORT fuses their activations") && why.contains("force_ops=Conv"),
        "{why}"
    );
    let (_, left, why) = convs_left(&g, &c, Target::Avx512);
    assert!(left.is_empty(), "{left:?}: {why}");
    // The generic target has no direct convolution.
    for act in [silu as fn(usize) -> Vec<NodeDesc>, lcnet_hardswish, hardswish] {
        let (g, c) = conv_chain(4, act);
        let (convs, left, why) = convs_left(&g, &c, Target::Generic);
        assert_eq!(left, convs);
        assert!(why.contains("without AVX2") && why.contains("force_ops=Conv"), "{why}");
    }
}

/// ReLU convolutions `(weight dims, output h×w)` in a chain, with the
/// output sizes known (`hw > 0`) or symbolic.
fn relu_convs(layers: &[([i64; 4], i64)]) -> (GraphDesc, HashMap<String, TensorValue>) {
    let mut nodes = Vec::new();
    let mut values: Vec<(String, Vec<i64>)> = Vec::new();
    for (k, &(w, hw)) in layers.iter().enumerate() {
        let x = if k == 0 { "x".to_string() } else { format!("a{}", k - 1) };
        nodes.push(node("Conv", &[&x, &format!("w{k}")], &[&format!("c{k}")]));
        nodes.extend(relu(k));
        values.push((format!("w{k}"), w.to_vec()));
        let hw = if hw > 0 { hw } else { -1 };
        values.push((format!("c{k}"), vec![1, w[0], hw, hw]));
    }
    let refs: Vec<(&str, &[i64])> = values.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
    let names: Vec<&str> = (0..layers.len()).map(|k| refs[2 * k].0).collect();
    (graph(nodes, &refs), weights(&names))
}

#[test]
fn dense_relu_networks_run_in_kiln() {
    // ResNet-like: 3x3 convolutions carry half the work beside 1x1 ones.
    let resnet = [
        ([256, 64, 1, 1], 56),
        ([64, 64, 3, 3], 56),
        ([64, 256, 1, 1], 56),
        ([256, 64, 1, 1], 56),
    ];
    // MobileNet-like: depthwise 3x3 (one channel per group) and 1x1.
    let mobile = [
        ([32, 1, 3, 3], 112),
        ([64, 32, 1, 1], 112),
        ([64, 1, 3, 3], 56),
        ([128, 64, 1, 1], 56),
    ];
    // The stem's 3 input channels are not a dense convolution either.
    let stem = [
        ([32, 3, 3, 3], 112),
        ([64, 32, 1, 1], 112),
        ([64, 64, 1, 1], 112),
        ([64, 64, 1, 1], 112),
    ];
    for symbolic in [false, true] {
        let sized = |l: &[([i64; 4], i64)]| -> Vec<([i64; 4], i64)> {
            l.iter().map(|&(w, hw)| (w, if symbolic { 0 } else { hw })).collect()
        };
        let (g, c) = relu_convs(&sized(&resnet));
        let (_, left, why) = convs_left(&g, &c, Target::Avx2);
        assert!(left.is_empty(), "{left:?}: {why}");
        // AVX-512 needs 60%: ResNet-50 ran slower than ORT on an Emerald Rapids.
        let (convs, left, why) = convs_left(&g, &c, Target::Avx512);
        assert_eq!(left, convs);
        assert!(why.contains("needs 60%") && why.contains("force_ops=Conv"), "{why}");
        // VGG-like: all of it dense.
        let (g, c) = relu_convs(&sized(&[([64, 64, 3, 3], 56), ([128, 64, 3, 3], 28)]));
        for target in [Target::Avx2, Target::Avx512] {
            let (_, left, why) = convs_left(&g, &c, target);
            assert!(left.is_empty(), "{target}: {left:?}: {why}");
        }
        let (convs, left, _) = convs_left(&g, &c, Target::Generic);
        assert_eq!(left, convs);
        for net in [&mobile[..], &stem[..]] {
            let (g, c) = relu_convs(&sized(net));
            let (convs, left, why) = convs_left(&g, &c, Target::Avx2);
            assert_eq!(left, convs);
            assert!(
                why.contains("(0% of their multiply-adds in dense k×k") && why.contains("needs 30%"),
                "{why}"
            );
        }
    }
    // Known sizes weigh by pixels: one dense layer at 7x7 beside 1x1 ones at
    // 56x56 is an eighth of the work; per pixel alone, nine tenths.
    let deep = [([64, 64, 1, 1], 56), ([64, 64, 3, 3], 7)];
    let (g, c) = relu_convs(&deep);
    let (convs, left, why) = convs_left(&g, &c, Target::Avx2);
    assert_eq!(left, convs);
    assert!(why.contains("(12% of their"), "{why}");
    let (g, c) = relu_convs(&deep.map(|(w, _)| (w, 0)));
    assert!(convs_left(&g, &c, Target::Avx2).1.is_empty());
}

#[test]
fn recurrent_layers_are_anchors_from_hidden_512() {
    for (op, gates) in [("LSTM", 4), ("GRU", 3)] {
        for (hidden, anchor) in [(100i64, false), (128, false), (256, false), (512, true), (1024, true)] {
            let g = graph(
                vec![node(op, &["x", "w", "r", "b"], &["y"])],
                &[
                    ("x", &[-1, 1, 64]),
                    ("w", &[2, gates * hidden, 64]),
                    ("r", &[2, gates * hidden, hidden]),
                ],
            );
            let c = weights(&["w", "r", "b"]);
            let mut rule = CostRule::new(&g, &c, &[], Target::Avx512);
            let out = rule.judge(&[vec![0]], &[true]);
            assert_eq!(out.is_empty(), anchor, "{op} hidden {hidden}: {out:?}");
        }
    }
}

#[test]
fn a_recurrent_layer_with_runtime_weights_is_not_an_anchor() {
    let g = graph(
        vec![node("LSTM", &["x", "w", "r"], &["y"])],
        &[("x", &[-1, 1, 64]), ("w", &[1, 2048, 64]), ("r", &[1, 2048, 512])],
    );
    let mut rule = CostRule::new(&g, &crate::ir::NO_CONSTANTS, &[], Target::Avx512);
    assert_eq!(reasons(&rule.judge(&[vec![0]], &[true])), vec![0]);
}
