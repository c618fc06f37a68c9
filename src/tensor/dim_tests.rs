use proptest::prelude::*;
use proptest::test_runner::Config;

use super::*;

fn a() -> Dim {
    Dim::sym("a")
}
fn b() -> Dim {
    Dim::sym("b")
}
fn k(n: i64) -> Dim {
    Dim::known(n)
}

fn bind<'a>(pairs: &'a [(&'a str, i64)]) -> impl Fn(&str) -> Option<i64> + 'a {
    move |s| pairs.iter().find(|(n, _)| *n == s).map(|&(_, v)| v)
}

#[test]
fn known_values_compute_as_integers() {
    assert_eq!((k(3) * k(4) - k(20)).as_known(), Some(-8));
    assert_eq!(k(7).div_floor(2).as_known(), Some(3));
    assert_eq!(k(-7).div_floor(2).as_known(), Some(-4));
    assert_eq!(k(7).div_ceil(2).as_known(), Some(4));
    assert_eq!(k(7).div_floor(-2).as_known(), Some(-4));
    assert_eq!(k(0), Dim::from(0usize));
    assert!(k(0).is_known() && !a().is_known());
    assert_eq!(Dim::from(5), k(5));
}

#[test]
fn equality_is_on_the_canonical_form() {
    assert_eq!(a() * b(), b() * a());
    assert_eq!(a() * 2 - a(), a());
    assert_eq!((a() + a()).div_floor(2), a());
    assert_eq!((a() * 4 + 8).div_floor(4), a() + 2);
    assert_eq!((a() + b()) * (a() - b()), a() * a() - b() * b());
    assert_eq!(a() - a(), k(0));
    assert_ne!(a(), b());
    assert_ne!(a().div_floor(2), a().div_floor(3));
}

#[test]
fn division_keeps_only_the_inexact_part_symbolic() {
    // 5a+9 = 4(a+2) + (a+1)
    assert_eq!((a() * 5 + 9).div_floor(4), a() + 2 + (a() + 1).div_floor(4));
    // floor(2y/4) = floor(y/2)
    assert_eq!((a() * 2 + 2).div_floor(4), (a() + 1).div_floor(2));
    // floor(floor(a/2)/3) = floor(a/6)
    assert_eq!(a().div_floor(2).div_floor(3), a().div_floor(6));
    assert_eq!(a().div_ceil(2), (a() + 1).div_floor(2));
    // A floor atom is an integer: multiples of d divide out of it exactly.
    assert_eq!((a().div_floor(3) * 4 + 8).div_floor(4), a().div_floor(3) + 2);
}

#[test]
fn display_is_readable() {
    assert_eq!((a() * b() + 1).to_string(), "a*b+1");
    assert_eq!((Dim::sym("batch") * Dim::sym("seq") + 1).to_string(), "batch*seq+1");
    assert_eq!(Dim::sym("h").div_ceil(2).to_string(), "floor((h+1)/2)");
    assert_eq!(a().div_floor(2).to_string(), "floor(a/2)");
    assert_eq!((k(1) - a() * 2).to_string(), "-2*a+1");
    assert_eq!((a() * 3 - b()).to_string(), "3*a-b");
    assert_eq!(k(-4).to_string(), "-4");
    assert_eq!(k(0).to_string(), "0");
    assert_eq!(Dim::sym("height/2").to_string(), "\"height/2\"");
    assert_eq!(format!("{:?}", a() + 1), "Dim(a+1)");
}

#[test]
fn eval_binds_symbols_and_fails_on_unbound_ones() {
    let e = (a() * b() + 3).div_floor(2);
    assert_eq!(e.eval(&bind(&[("a", 3), ("b", 5)])), Some(9));
    assert_eq!(e.eval(&bind(&[("a", 3)])), None);
    assert_eq!(k(4).eval(&|_| None), Some(4));
    let syms: Vec<String> = e.symbols().into_iter().collect();
    assert_eq!(syms, ["a", "b"]);
    assert_eq!(a().div_floor(2).symbols().len(), 1);
}

#[test]
fn overflow_is_a_value_not_a_panic() {
    let max = k(i64::MAX);
    for d in [
        &max + 1,
        &max * 2,
        -k(i64::MIN),
        k(i64::MIN).div_floor(-1),
        k(i64::MIN).div_ceil(1) - 1,
        a() * i64::MAX * 2,
        a().div_floor(0),
        Dim::from(usize::MAX),
    ] {
        assert!(d.is_overflow(), "{d}");
        assert!(!d.is_known());
        assert_eq!(d.eval(&|_| Some(1)), None);
        assert_eq!(d.to_string(), "overflow");
        // Overflow absorbs every later operation.
        assert!((&d - &d).is_overflow());
        assert!((&d * &k(0)).is_overflow());
        assert!((-&d).is_overflow());
        assert!(d.div_floor(3).is_overflow());
    }
    // Evaluation overflows to None too.
    assert_eq!((a() * a()).eval(&|_| Some(i64::MAX)), None);
    assert_eq!(k(i64::MAX).eval(&|_| None), Some(i64::MAX));
}

#[test]
fn nonneg_hint() {
    assert!(k(0).is_nonneg_hint() && k(3).is_nonneg_hint());
    assert!(!k(-1).is_nonneg_hint());
    assert!((a() * b() * 2 + 1).is_nonneg_hint());
    assert!((a() + 1).div_floor(2).is_nonneg_hint());
    assert!(!(a() - 1).is_nonneg_hint());
    assert!(!Dim::overflow().is_nonneg_hint());
}

#[test]
fn broadcasting_follows_onnx() {
    let s = |v: &[Dim]| v.to_vec();
    assert_eq!(
        broadcast_dims(&[a(), k(1), k(3)], &[k(4), k(3)]),
        Some(s(&[a(), k(4), k(3)]))
    );
    assert_eq!(broadcast_dims(&[k(2)], &[k(3)]), None);
    assert_eq!(broadcast_dims(&[a()], &[k(5)]), Some(s(&[k(5)])));
    assert_eq!(broadcast_dims(&[k(5)], &[a()]), Some(s(&[k(5)])));
    assert_eq!(broadcast_dims(&[k(1)], &[a()]), Some(s(&[a()])));
    assert_eq!(broadcast_dims(&[a()], &[a()]), Some(s(&[a()])));
    // Two different symbols: the first, by documented assumption.
    assert_eq!(broadcast_dims(&[a()], &[b()]), Some(s(&[a()])));
    assert_eq!(broadcast_dims(&[k(0)], &[k(1)]), Some(s(&[k(0)])));
    assert_eq!(broadcast_dims(&[k(-1)], &[k(1)]), None);
    assert_eq!(broadcast_dims(&[], &[]), Some(vec![]));
}

#[test]
fn numel_is_the_product() {
    assert_eq!(numel(&[]), k(1));
    assert_eq!(numel(&[a(), k(3), b()]), b() * a() * 3);
    assert_eq!(numel(&[a(), k(0)]), k(0));
    let dims = [a(), b()];
    let s: Dim = dims.iter().sum();
    assert_eq!(s, b() + a());
}

// ---- properties ----

fn config() -> Config {
    Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    }
}

const SYMS: [&str; 3] = ["a", "b", "c"];

/// A random expression tree and the dim it builds, built two ways: as a
/// `Dim` and as the tree to evaluate with plain integer arithmetic.
#[derive(Clone, Debug)]
enum Expr {
    Known(i64),
    Sym(usize),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    Neg(Box<Expr>),
    Floor(Box<Expr>, i64),
    Ceil(Box<Expr>, i64),
}

impl Expr {
    fn dim(&self) -> Dim {
        match self {
            Expr::Known(n) => k(*n),
            Expr::Sym(i) => Dim::sym(SYMS[*i]),
            Expr::Add(x, y) => x.dim() + y.dim(),
            Expr::Sub(x, y) => x.dim() - y.dim(),
            Expr::Mul(x, y) => &x.dim() * &y.dim(),
            Expr::Neg(x) => -x.dim(),
            Expr::Floor(x, d) => x.dim().div_floor(*d),
            Expr::Ceil(x, d) => x.dim().div_ceil(*d),
        }
    }

    fn value(&self, vals: &[i64; 3]) -> Option<i64> {
        Some(match self {
            Expr::Known(n) => *n,
            Expr::Sym(i) => vals[*i],
            Expr::Add(x, y) => x.value(vals)?.checked_add(y.value(vals)?)?,
            Expr::Sub(x, y) => x.value(vals)?.checked_sub(y.value(vals)?)?,
            Expr::Mul(x, y) => x.value(vals)?.checked_mul(y.value(vals)?)?,
            Expr::Neg(x) => x.value(vals)?.checked_neg()?,
            Expr::Floor(x, d) => x.value(vals)?.div_euclid(*d),
            Expr::Ceil(x, d) => {
                let v = x.value(vals)?;
                v.div_euclid(*d) + i64::from(v.rem_euclid(*d) != 0)
            }
        })
    }
}

/// Trees of depth `depth`; with leaves in -6..=6 and values in -10..=20, a
/// depth-3 tree (or a product of two depth-2 ones) cannot overflow `i64`
/// even in its expanded form, so every comparison below is exact.
fn expr_of(depth: u32) -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![(-6i64..=6).prop_map(Expr::Known), (0usize..3).prop_map(Expr::Sym)];
    leaf.prop_recursive(depth, 16, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(x, y)| Expr::Add(x.into(), y.into())),
            (inner.clone(), inner.clone()).prop_map(|(x, y)| Expr::Sub(x.into(), y.into())),
            (inner.clone(), inner.clone()).prop_map(|(x, y)| Expr::Mul(x.into(), y.into())),
            inner.clone().prop_map(|x| Expr::Neg(x.into())),
            (inner.clone(), 1i64..=6).prop_map(|(x, d)| Expr::Floor(x.into(), d)),
            (inner, 1i64..=6).prop_map(|(x, d)| Expr::Ceil(x.into(), d)),
        ]
    })
}

/// Symbol values; negative ones too, so the floor identities are checked
/// beyond the dims' own range.
fn values() -> impl Strategy<Value = [i64; 3]> {
    [-10i64..=20, -10i64..=20, -10i64..=20]
}

fn expr() -> impl Strategy<Value = Expr> {
    expr_of(3)
}

fn eval_at(d: &Dim, vals: &[i64; 3]) -> Option<i64> {
    d.eval(&|s| SYMS.iter().position(|&n| n == s).map(|i| vals[i]))
}

proptest! {
    #![proptest_config(config())]

    /// eval(x op y) == eval(x) op eval(y), for every op, through whole trees.
    #[test]
    fn evaluation_commutes_with_arithmetic(e in expr(), vals in values()) {
        let want = e.value(&vals);
        prop_assert!(want.is_some());
        prop_assert_eq!(eval_at(&e.dim(), &vals), want, "{} = {:?}", e.dim(), e);
    }

    #[test]
    fn each_op_commutes_with_eval(x in expr_of(2), y in expr_of(2), d in 1i64..=7, vals in values()) {
        let (dx, dy) = (x.dim(), y.dim());
        let (vx, vy) = (x.value(&vals).unwrap(), y.value(&vals).unwrap());
        prop_assert_eq!(eval_at(&dx, &vals), Some(vx));
        prop_assert_eq!(eval_at(&dy, &vals), Some(vy));
        prop_assert_eq!(eval_at(&(&dx + &dy), &vals), Some(vx + vy));
        prop_assert_eq!(eval_at(&(&dx - &dy), &vals), Some(vx - vy));
        prop_assert_eq!(eval_at(&(&dx * &dy), &vals), Some(vx * vy));
        prop_assert_eq!(eval_at(&-&dx, &vals), Some(-vx));
        prop_assert_eq!(eval_at(&dx.div_floor(d), &vals), Some(vx.div_euclid(d)));
        prop_assert_eq!(eval_at(&dx.div_ceil(d), &vals), Some((vx + d - 1).div_euclid(d)));
        prop_assert_eq!(eval_at(&dx.div_floor(-d), &vals), Some((-vx).div_euclid(d)));
    }

    /// Canonical equality implies equal values; algebraic identities hold
    /// structurally.
    #[test]
    fn canonical_equality_implies_equal_values(x in expr_of(2), y in expr_of(2), z in expr_of(2), vals in values()) {
        let (dx, dy, dz) = (x.dim(), y.dim(), z.dim());
        if dx == dy {
            prop_assert_eq!(eval_at(&dx, &vals), eval_at(&dy, &vals));
        }
        prop_assert_eq!(&dx + &dy, &dy + &dx);
        prop_assert_eq!(&dx * &dy, &dy * &dx);
        prop_assert_eq!(&(&dx * &dy) * &dz, &dx * &(&dy * &dz));
        prop_assert_eq!(&dx * &(&dy + &dz), &(&dx * &dy) + &(&dx * &dz));
        prop_assert_eq!(&dx - &dx, k(0));
        prop_assert_eq!((&dx * 6).div_floor(3), &dx * 2);
        prop_assert_eq!((&dx * 3 + &dy * 6).div_floor(3), &dx + &dy * 2);
        // Equal forms print the same; a form's text is stable.
        prop_assert_eq!((&dx + &dy).to_string(), (&dy + &dx).to_string());
    }

    #[test]
    fn nonneg_hint_holds_for_nonneg_bindings(e in expr(), vals in [0i64..=20, 0i64..=20, 0i64..=20]) {
        let d = e.dim();
        if d.is_nonneg_hint() {
            if let Some(v) = eval_at(&d, &vals) {
                prop_assert!(v >= 0, "{} = {}", d, v);
            }
        }
    }

    #[test]
    fn broadcasting_commutes_on_known_dims(
        x in prop::collection::vec(prop_oneof![Just(1i64), 2i64..=4], 0..=4),
        y in prop::collection::vec(prop_oneof![Just(1i64), 2i64..=4], 0..=4),
    ) {
        let dx: Vec<Dim> = x.iter().map(|&n| k(n)).collect();
        let dy: Vec<Dim> = y.iter().map(|&n| k(n)).collect();
        prop_assert_eq!(broadcast_dims(&dx, &dy), broadcast_dims(&dy, &dx));
    }
}
