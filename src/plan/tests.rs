use super::*;
use crate::error::ErrorKind;
use crate::kernels::parallel::Serial;
use crate::kernels::Strided;

fn f32spec(name: &str, shape: &[usize]) -> TensorSpec {
    TensorSpec::new(name, DType::F32, shape)
}

/// y = relu(x + c) with x, y [2,2], c [2] and one scratch buffer.
fn parts() -> ProgramParts {
    let t = BufRef::Scratch { offset: 0, len: 16 };
    ProgramParts {
        target: Target::Generic,
        inputs: vec![f32spec("x", &[2, 2])],
        outputs: vec![f32spec("y", &[2, 2])],
        constants: vec![Constant::plain(DType::F32, &[2], Weight::from_vec(vec![1.0, 2.0]))],
        steps: vec![
            Step::Binary {
                op: BinaryOp::Add,
                dtype: DType::F32,
                layout: Layout::RowB { inner: 2 },
                a: BufRef::Input(0),
                b: BufRef::Constant(0),
                dst: t,
            },
            Step::Unary {
                op: UnaryOp::Relu,
                src: t,
                dst: BufRef::Output(0),
            },
        ],
        arena_bytes: 16,
        op_counts: vec![("Add".into(), 1), ("Relu".into(), 1)],
    }
}

fn refused(p: ProgramParts, needle: &str) {
    let e = Program::from_parts(p).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidGraph, "{e}");
    assert!(e.message.contains(needle), "{needle:?} not in: {e}");
    assert!(e.message.starts_with("corrupt kiln program"), "{e}");
}

fn run1(p: &Program, x: &[f32], y: &mut [f32]) -> Result<()> {
    p.run(Target::Generic, &[TensorRef::F32(x)], &mut [TensorMut::F32(y)], &Serial)
}

#[test]
fn valid_parts_run() {
    let p = Program::from_parts(parts()).unwrap();
    let mut y = [0.0; 4];
    run1(&p, &[-5.0, 0.0, 1.0, 2.0], &mut y).unwrap();
    assert_eq!(y, [0.0, 2.0, 2.0, 4.0]);
    assert_eq!(p.arena_bytes(), 16);
    assert_eq!(p.op_summary(), "Add x1, Relu x1");
    // Clones share constants and run on their own scratch.
    let q = p.clone();
    run1(&q, &[1.0; 4], &mut y).unwrap();
    assert_eq!(y, [2.0, 3.0, 2.0, 3.0]);
}

#[test]
fn io_types_and_lengths_are_checked() {
    let p = Program::from_parts(parts()).unwrap();
    let mut y = [0.0; 4];
    let e = p
        .run(
            Target::Generic,
            &[TensorRef::I64(&[1; 4])],
            &mut [TensorMut::F32(&mut y)],
            &Serial,
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("'x' is float, got int64"), "{e}");
    let e = run1(&p, &[1.0; 3], &mut y).unwrap_err();
    assert!(e.message.contains("'x'") && e.message.contains("[2,2]"), "{e}");
}

#[test]
fn out_of_range_refs() {
    let bad = [
        BufRef::Input(1),
        BufRef::Constant(1),
        BufRef::Output(1),
        BufRef::Scratch { offset: 4, len: 16 },
        BufRef::Scratch {
            offset: usize::MAX,
            len: 2,
        },
    ];
    for r in bad {
        let mut p = parts();
        p.steps[1] = Step::Unary {
            op: UnaryOp::Neg,
            src: r,
            dst: BufRef::Output(0),
        };
        refused(p, "out of range");
    }
}

#[test]
fn wrong_types_and_alignment() {
    let mut p = parts();
    p.steps[1] = Step::Cast {
        from: DType::I64,
        to: DType::F32,
        src: BufRef::Input(0),
        dst: BufRef::Output(0),
    };
    refused(p, "holds float, as int64");
    let mut p = parts();
    p.arena_bytes = 20;
    p.steps[0] = Step::Unary {
        op: UnaryOp::Neg,
        src: BufRef::Input(0),
        dst: BufRef::Scratch { offset: 2, len: 16 },
    };
    p.steps[1] = Step::Unary {
        op: UnaryOp::Neg,
        src: BufRef::Scratch { offset: 2, len: 16 },
        dst: BufRef::Output(0),
    };
    refused(p, "not aligned");
}

#[test]
fn writes_to_read_only_or_aliased_buffers() {
    for dst in [BufRef::Input(0), BufRef::Constant(0)] {
        let mut p = parts();
        p.steps[1] = Step::Copy {
            src: BufRef::Output(0),
            dst,
        };
        refused(p, "read-only");
    }
    let mut p = parts();
    p.steps[1] = Step::Copy {
        src: BufRef::Output(0),
        dst: BufRef::Output(0),
    };
    refused(p, "overlaps");
}

#[test]
fn inconsistent_lengths_and_layouts() {
    let mut p = parts();
    p.steps[1] = Step::Unary {
        op: UnaryOp::Relu,
        src: BufRef::Constant(0),
        dst: BufRef::Output(0),
    };
    refused(p, "do not allow");
    let layouts = [
        Layout::Same,
        Layout::ScalarB,
        Layout::RowB { inner: 3 },
        Layout::Strided(Strided {
            dims: vec![usize::MAX, 2],
            a_strides: vec![0, 1],
            b_strides: vec![0, 1],
        }),
    ];
    for layout in layouts {
        let mut p = parts();
        if let Step::Binary { layout: l, .. } = &mut p.steps[0] {
            *l = layout.clone();
        }
        refused(p, "do not allow");
    }
    let mut p = parts();
    p.steps[1] = Step::Softmax {
        len: 3,
        inner: 1,
        unshifted: false,
        src: BufRef::Scratch { offset: 0, len: 16 },
        dst: BufRef::Output(0),
    };
    refused(p, "do not allow");
    let mut p = parts();
    p.steps[1] = Step::Strided {
        dtype: DType::F32,
        plan: CopyPlan::new(&[4], 1, &[1], 0, &[1]),
        src: BufRef::Scratch { offset: 0, len: 16 },
        dst: BufRef::Output(0),
    };
    refused(p, "do not allow");
}

#[test]
fn bad_sizes_and_specs() {
    let mut p = parts();
    p.arena_bytes = 1 << 40;
    refused(p, "larger than its steps use");
    let mut p = parts();
    p.inputs[0].shape = vec![1 << 40, 1 << 40];
    refused(p, "too large");
    let mut p = parts();
    p.outputs[0].name.clear();
    refused(p, "empty name");
    let mut p = parts();
    p.outputs[0].elem_type = 11;
    refused(p, "double");
    let mut p = parts();
    p.constants[0].shape = vec![3].into();
    refused(p, "constant 0");
    let mut p = parts();
    p.outputs.push(f32spec("z", &[1]));
    refused(p, "no step writes output 1 'z'");
}

#[test]
fn matmul_gather_cast_where_steps() {
    // y[2,3] = x[2,2] @ w[2,3] + b; idx gathers rows of y; mask selects.
    let w = Weight::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let pb = gemm::PackedB::pack(Target::Generic, w.as_slice(), 2, 3, false);
    let t = BufRef::Scratch { offset: 0, len: 24 };
    let g = BufRef::Scratch { offset: 64, len: 24 };
    let parts = ProgramParts {
        target: Target::Generic,
        inputs: vec![
            f32spec("x", &[2, 2]),
            TensorSpec::new("idx", DType::I64, &[2]),
            TensorSpec::new("m", DType::Bool, &[2, 1]),
        ],
        outputs: vec![f32spec("y", &[2, 3]), TensorSpec::new("yi", DType::I32, &[2, 3])],
        constants: vec![
            Constant {
                dtype: DType::F32,
                shape: vec![2, 3].into(),
                data: pb.data().clone(),
                packing: Packing::GemmB { k: 2, n: 3 },
            },
            Constant::plain(DType::F32, &[3], Weight::from_vec(vec![0.5, 0.25, 0.0])),
        ],
        steps: vec![
            Step::MatMul(Box::new(MatMulStep {
                m: 2,
                n: 3,
                k: 2,
                trans_a: false,
                a: BufRef::Input(0),
                b: MatB::Packed(0),
                batches: vec![[0, 0]],
                alpha: 1.0,
                bias: MatBias::Row(BufRef::Constant(1)),
                activation: Activation::None,
                residual: None,
                dst: t,
            })),
            Step::Gather {
                dtype: DType::F32,
                idx_dtype: DType::I64,
                outer: 1,
                axis_len: 2,
                inner: 3,
                data: t,
                indices: BufRef::Input(1),
                dst: g,
            },
            Step::Where {
                dtype: DType::F32,
                layout: Where3::for_shapes(&[2, 1], &[2, 3], &[2, 3], &[2, 3]),
                cond: BufRef::Input(2),
                x: g,
                y: t,
                dst: BufRef::Output(0),
            },
            Step::Cast {
                from: DType::F32,
                to: DType::I32,
                src: BufRef::Output(0),
                dst: BufRef::Output(1),
            },
        ],
        arena_bytes: 88,
        op_counts: vec![],
    };
    let p = Program::from_parts(parts).unwrap();
    assert_eq!(p.packed_constants(), 1);
    let (mut y, mut yi) = ([0.0f32; 6], [0i32; 6]);
    p.run(
        Target::Generic,
        &[
            TensorRef::F32(&[1.0, 0.0, 0.0, 1.0]),
            TensorRef::I64(&[-1, 0]),
            TensorRef::Bool(&[1, 0]),
        ],
        &mut [TensorMut::F32(&mut y), TensorMut::I32(&mut yi)],
        &Serial,
    )
    .unwrap();
    // x @ w + b = [[1.5, 2.25, 3], [4.5, 5.25, 6]]; row 0 takes gathered row 1.
    assert_eq!(y, [4.5, 5.25, 6.0, 4.5, 5.25, 6.0]);
    assert_eq!(yi, [4, 5, 6, 4, 5, 6]);
    let e = p
        .run(
            Target::Generic,
            &[
                TensorRef::F32(&[1.0; 4]),
                TensorRef::I64(&[2, 0]),
                TensorRef::Bool(&[1, 0]),
            ],
            &mut [TensorMut::F32(&mut y), TensorMut::I32(&mut yi)],
            &Serial,
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("Gather index 2"), "{e}");
}

/// y [2] = GatherND(x [3], i [2, 1]) with int64 indices read from input 1.
fn gather_nd_parts(dims: Vec<usize>, slice: usize) -> ProgramParts {
    ProgramParts {
        target: Target::Generic,
        inputs: vec![f32spec("x", &[3]), TensorSpec::new("i", DType::I64, &[2, 1])],
        outputs: vec![f32spec("y", &[2])],
        constants: vec![],
        steps: vec![Step::Index(Box::new(IndexStep::GatherNd {
            dtype: DType::F32,
            idx_dtype: DType::I64,
            batch: 1,
            dims,
            slice,
            data: BufRef::Input(0),
            indices: BufRef::Input(1),
            dst: BufRef::Output(0),
        }))],
        arena_bytes: 0,
        op_counts: vec![],
    }
}

#[test]
fn index_steps_are_validated_and_check_their_indices() {
    let p = Program::from_parts(gather_nd_parts(vec![3], 1)).unwrap();
    let x = [1.0f32, 2.0, 3.0];
    let mut y = [0.0f32; 2];
    let run = |i: &[i64], y: &mut [f32]| {
        p.run(
            Target::Generic,
            &[TensorRef::F32(&x), TensorRef::I64(i)],
            &mut [TensorMut::F32(y)],
            &Serial,
        )
    };
    run(&[2, -3], &mut y).unwrap();
    assert_eq!(y, [3.0, 1.0]);
    let e = run(&[0, 3], &mut y).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains("GatherND index 3 is out of range"), "{e}");
    // Parameters that do not fit the buffers are refused at load.
    refused(gather_nd_parts(vec![4], 1), "which its parameters do not allow");
    refused(gather_nd_parts(vec![3], 2), "which its parameters do not allow");
    refused(gather_nd_parts(vec![], 3), "which its parameters do not allow");
}

#[test]
fn huge_page_bytes_are_zeroed_aligned_and_writable() {
    let len = HugePageBytes::HUGE_PAGE + 12345;
    let mut b = HugePageBytes::zeroed(len).unwrap();
    assert_eq!(b.bytes().len(), len);
    assert_eq!(b.bytes().as_ptr() as usize % HugePageBytes::HUGE_PAGE, 0);
    assert!(b.bytes().iter().all(|&x| x == 0));
    b.bytes_mut()[len - 1] = 7;
    assert_eq!(b.bytes()[len - 1], 7);
    // A packed weight that large lives in such storage and packs the same.
    let (k, n) = (1024, 600);
    let w: Vec<f32> = (0..k * n).map(|i| (i % 977) as f32).collect();
    let big = crate::kernels::gemm::PackedB::pack(Target::Generic, &w, k, n, false);
    assert!(big.data().byte_len() >= HugePageBytes::HUGE_PAGE);
    let small = crate::kernels::gemm::PackedB::pack(Target::Generic, &w[..8 * n], 8, n, false);
    assert_eq!(&big.data().as_slice()[..8 * 8], &small.data().as_slice()[..8 * 8]);
}

/// The scratch pool hands back a kept arena large enough, replaces a
/// smaller one with a quarter of headroom (an input that grows by small
/// steps reuses it), and maps big arenas with huge pages.
#[test]
fn scratch_arenas_are_reused_grown_with_headroom_and_huge_when_big() {
    let pool = ScratchPool::default();
    let a = pool.take(1000).unwrap();
    assert!(matches!(a, Arena::Small(_)) && a.len() == 1000);
    pool.give(a);
    let mut b = pool.take(1100).unwrap();
    assert_eq!(b.len(), 1250, "grown by a quarter");
    let at = b.bytes_mut().as_ptr();
    pool.give(b);
    let mut c = pool.take(1200).unwrap();
    assert_eq!(c.bytes_mut().as_ptr(), at, "the kept arena fits");
    pool.give(c);
    let big = pool.take(HugePageBytes::HUGE_PAGE + 1).unwrap();
    assert!(matches!(big, Arena::Huge(_)), "a big arena is mapped");
    assert!(big.len() > HugePageBytes::HUGE_PAGE);
}
