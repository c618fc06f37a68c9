//! Symbolic tensor dimensions.
//!
//! A [`Dim`] is a known integer or an integer expression over named symbols
//! (ONNX `dim_param`s, or fresh symbols kiln makes for unnamed unknown
//! dims). Real models compute shapes (`Shape → Gather → Mul → Concat →
//! Reshape`), so a dim supports `+`, `-`, `*` and floor/ceil division by a
//! constant, and stays in one canonical form so that two dims are equal
//! exactly when their forms are equal: `a*b == b*a`, `2*a - a == a`,
//! `(a+a)/2 == a`.
//!
//! The canonical form is a sum of monomials with non-zero `i64`
//! coefficients; a monomial is a sorted multiset of atoms; an atom is a
//! symbol or `floor(e/d)` for an expression `e` the division could not be
//! carried out on exactly. Two dims that are equal as functions of their
//! symbols but built through different floor divisions may still compare
//! unequal (equality is sound, not complete).
//!
//! Arithmetic on coefficients is checked. A result that does not fit an
//! `i64` becomes the *overflow* dim: it absorbs every later operation,
//! evaluates to `None`, is never [`Dim::is_known`], and prints `overflow`.
//! No operation panics.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::iter::{Product, Sum};
use std::ops::{Add, Mul, Neg, Sub};

/// A factor of a monomial.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
enum Atom {
    /// A named symbol; its value is a dimension, so `>= 0`.
    Sym(String),
    /// `floor(e / d)` with `d > 1`, where `e` is not a multiple of `d`.
    FloorDiv(Box<Dim>, i64),
    /// The result of an operation that overflowed `i64`. Only ever the
    /// single atom of the single monomial of [`Dim::overflow`].
    Overflow,
}

/// A sorted multiset of atoms; empty for the constant term.
type Monomial = Vec<Atom>;

/// A tensor dimension: a known integer or a canonical expression over
/// symbols. See the module documentation.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dim {
    /// Monomial → coefficient; coefficients are never zero, so zero is the
    /// empty map.
    terms: BTreeMap<Monomial, i64>,
}

impl Dim {
    /// A known dimension. Negative values are allowed: shape arithmetic
    /// (`Reshape`'s `-1`, `Slice` bounds) passes through them.
    pub fn known(n: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if n != 0 {
            terms.insert(Vec::new(), n);
        }
        Dim { terms }
    }

    /// The dimension named `name` (an ONNX `dim_param`).
    pub fn sym(name: &str) -> Dim {
        Dim::monomial(vec![Atom::Sym(name.to_string())], 1)
    }

    /// The result of an overflowing operation; see the module documentation.
    pub fn overflow() -> Dim {
        Dim::monomial(vec![Atom::Overflow], 1)
    }

    /// True for the result of an operation that overflowed `i64`.
    pub fn is_overflow(&self) -> bool {
        self.terms.keys().any(|m| m.contains(&Atom::Overflow))
    }

    /// The value if it does not depend on any symbol.
    pub fn as_known(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    pub fn is_known(&self) -> bool {
        self.as_known().is_some()
    }

    /// `floor(self / d)`. Exact whenever it can be: the part of every
    /// coefficient divisible by `d` is divided out (`(4*a+9)/4` is
    /// `a+2+floor(1/4)` = `a+2`), and only the remainder, if it still
    /// depends on symbols, stays as a `floor(…/d)` atom. `d < 0` divides
    /// `-self` by `-d`; `d == 0` gives the overflow dim.
    pub fn div_floor(&self, d: i64) -> Dim {
        if d == 0 || self.is_overflow() {
            return Dim::overflow();
        }
        if d < 0 {
            return match d.checked_neg() {
                Some(nd) => (-self).div_floor(nd),
                None => Dim::overflow(),
            };
        }
        if d == 1 {
            return self.clone();
        }
        // self = d*quotient + rest, every coefficient of rest in 0..d.
        let mut quotient = BTreeMap::new();
        let mut rest = BTreeMap::new();
        for (m, &c) in &self.terms {
            let (q, r) = (c.div_euclid(d), c.rem_euclid(d));
            if q != 0 {
                quotient.insert(m.clone(), q);
            }
            if r != 0 {
                rest.insert(m.clone(), r);
            }
        }
        let quotient = Dim { terms: quotient };
        let rest = Dim { terms: rest };
        quotient + floor_of_rest(rest, d)
    }

    /// `ceil(self / d)` for `d > 0`, as `floor((self + d - 1) / d)`; `d <= 0`
    /// gives the overflow dim.
    pub fn div_ceil(&self, d: i64) -> Dim {
        if d <= 0 {
            return Dim::overflow();
        }
        (self + (d - 1)).div_floor(d)
    }

    /// The value under the symbol binding `value_of`; `None` if a symbol is
    /// unbound or the arithmetic overflows.
    pub fn eval(&self, value_of: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        let mut sum: i64 = 0;
        for (m, &c) in &self.terms {
            let mut term = c;
            for atom in m {
                term = term.checked_mul(atom.eval(value_of)?)?;
            }
            sum = sum.checked_add(term)?;
        }
        Some(sum)
    }

    /// Every symbol the dim depends on.
    pub fn symbols(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        self.collect_symbols(&mut out);
        out
    }

    /// True when the dim is certainly `>= 0` given that every symbol is (a
    /// symbol is a dimension): a known value `>= 0`, or an expression whose
    /// coefficients are all `>= 0`. False means "not shown", not "negative".
    pub fn is_nonneg_hint(&self) -> bool {
        self.terms
            .iter()
            .all(|(m, &c)| c >= 0 && m.iter().all(Atom::is_nonneg_hint))
    }

    fn monomial(m: Monomial, c: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if c != 0 {
            terms.insert(m, c);
        }
        Dim { terms }
    }

    fn collect_symbols(&self, out: &mut BTreeSet<String>) {
        for atom in self.terms.keys().flatten() {
            match atom {
                Atom::Sym(s) => {
                    out.insert(s.clone());
                }
                Atom::FloorDiv(e, _) => e.collect_symbols(out),
                Atom::Overflow => {}
            }
        }
    }

    /// The single atom with coefficient 1 this dim is, if it is one.
    fn as_atom(&self) -> Option<&Atom> {
        match self.terms.iter().next() {
            Some((m, 1)) if self.terms.len() == 1 && m.len() == 1 => Some(&m[0]),
            _ => None,
        }
    }

    fn add_dim(&self, other: &Dim) -> Dim {
        if self.is_overflow() || other.is_overflow() {
            return Dim::overflow();
        }
        let mut terms = self.terms.clone();
        for (m, &c) in &other.terms {
            let sum = match terms.get(m) {
                Some(&old) => match old.checked_add(c) {
                    Some(s) => s,
                    None => return Dim::overflow(),
                },
                None => c,
            };
            if sum == 0 {
                terms.remove(m);
            } else {
                terms.insert(m.clone(), sum);
            }
        }
        Dim { terms }
    }

    fn mul_dim(&self, other: &Dim) -> Dim {
        if self.is_overflow() || other.is_overflow() {
            return Dim::overflow();
        }
        let mut out = Dim::known(0);
        for (ma, &ca) in &self.terms {
            for (mb, &cb) in &other.terms {
                let Some(c) = ca.checked_mul(cb) else {
                    return Dim::overflow();
                };
                let mut m: Monomial = ma.iter().chain(mb).cloned().collect();
                m.sort();
                out = out.add_dim(&Dim::monomial(m, c));
                if out.is_overflow() {
                    return out;
                }
            }
        }
        out
    }

    fn neg_dim(&self) -> Dim {
        if self.is_overflow() {
            return Dim::overflow();
        }
        let mut terms = BTreeMap::new();
        for (m, &c) in &self.terms {
            let Some(n) = c.checked_neg() else {
                return Dim::overflow();
            };
            terms.insert(m.clone(), n);
        }
        Dim { terms }
    }
}

/// `floor(rest / d)` for `d > 1` and `rest` with every coefficient in `0..d`.
fn floor_of_rest(rest: Dim, d: i64) -> Dim {
    if let Some(n) = rest.as_known() {
        return Dim::known(n.div_euclid(d));
    }
    // floor(g*y / d) == floor(y / (d/g)) when g divides every coefficient
    // and d: the two fractions are the same number.
    let g = rest.terms.values().fold(d, |g, &c| gcd(g, c));
    let (rest, d) = if g > 1 {
        let terms = rest.terms.into_iter().map(|(m, c)| (m, c / g)).collect();
        (Dim { terms }, d / g)
    } else {
        (rest, d)
    };
    if d == 1 {
        return rest;
    }
    // floor(floor(e/a)/d) == floor(e/(a*d)) for a, d > 0.
    if let Some(Atom::FloorDiv(e, a)) = rest.as_atom() {
        return match a.checked_mul(d) {
            Some(ad) => e.div_floor(ad),
            None => Dim::overflow(),
        };
    }
    Dim::monomial(vec![Atom::FloorDiv(Box::new(rest), d)], 1)
}

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    // Only called with d > 1 in the fold, so the gcd is in 1..=d.
    a as i64
}

impl Atom {
    fn eval(&self, value_of: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        match self {
            Atom::Sym(s) => value_of(s),
            Atom::FloorDiv(e, d) => Some(e.eval(value_of)?.div_euclid(*d)),
            Atom::Overflow => None,
        }
    }

    fn is_nonneg_hint(&self) -> bool {
        match self {
            Atom::Sym(_) => true,
            Atom::FloorDiv(e, _) => e.is_nonneg_hint(),
            Atom::Overflow => false,
        }
    }
}

/// ONNX multidirectional broadcasting of two shapes, aligned on the right.
/// Per axis: equal dims give that dim; a known 1 gives the other; two
/// different known dims other than 1 do not broadcast (`None`); a symbolic
/// dim against a known `n != 1` gives `n` (the symbol must be 1 or `n` at
/// run time). Two *different symbolic* dims give the first one: kiln
/// assumes they are equal at run time rather than invent a `max` atom —
/// if they are not, ORT's own shape checks (and kiln's run-time shape
/// checks on concrete shapes) reject the input anyway. A known negative dim
/// is not a shape: `None`.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let rank = a.len().max(b.len());
    let pad = |s: &[Dim], i: usize| -> Dim {
        let lead = rank - s.len();
        if i < lead {
            Dim::known(1)
        } else {
            s[i - lead].clone()
        }
    };
    (0..rank).map(|i| broadcast_pair(pad(a, i), pad(b, i))).collect()
}

fn broadcast_pair(x: Dim, y: Dim) -> Option<Dim> {
    if x.as_known().is_some_and(|n| n < 0) || y.as_known().is_some_and(|n| n < 0) {
        return None;
    }
    if x == y || y.as_known() == Some(1) {
        return Some(x);
    }
    if x.as_known() == Some(1) {
        return Some(y);
    }
    match (x.is_known(), y.is_known()) {
        (true, true) => None,
        (false, true) => Some(y),
        _ => Some(x),
    }
}

/// The number of elements of a tensor with these dims (1 for a scalar).
pub fn numel(dims: &[Dim]) -> Dim {
    dims.iter().product()
}

impl fmt::Display for Dim {
    /// Readable and stable: `batch*seq+1`, `floor((h+1)/2)`, `2*a-b`.
    /// Symbolic terms come first (in canonical order), the constant last.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_overflow() {
            return f.write_str("overflow");
        }
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        let constant = self.terms.get(&Vec::new());
        let symbolic = self.terms.iter().filter(|(m, _)| !m.is_empty());
        let mut first = true;
        for (m, &c) in symbolic {
            write_sign(f, c, first)?;
            let abs = c.unsigned_abs();
            if abs != 1 {
                write!(f, "{abs}*")?;
            }
            for (i, atom) in m.iter().enumerate() {
                if i > 0 {
                    f.write_str("*")?;
                }
                write!(f, "{atom}")?;
            }
            first = false;
        }
        if let Some(&c) = constant {
            write_sign(f, c, first)?;
            write!(f, "{}", c.unsigned_abs())?;
        }
        Ok(())
    }
}

fn write_sign(f: &mut fmt::Formatter<'_>, c: i64, first: bool) -> fmt::Result {
    match (c < 0, first) {
        (true, _) => f.write_str("-"),
        (false, false) => f.write_str("+"),
        (false, true) => Ok(()),
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // dim_params are free text; quote the ones that would read as
            // an expression.
            Atom::Sym(s) if is_plain_name(s) => f.write_str(s),
            Atom::Sym(s) => write!(f, "{s:?}"),
            Atom::FloorDiv(e, d) if e.as_atom().is_some() => write!(f, "floor({e}/{d})"),
            Atom::FloorDiv(e, d) => write!(f, "floor(({e})/{d})"),
            Atom::Overflow => f.write_str("overflow"),
        }
    }
}

fn is_plain_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dim({self})")
    }
}

impl From<i64> for Dim {
    fn from(n: i64) -> Dim {
        Dim::known(n)
    }
}

/// So that `Dim::from(3)` (an `i32` literal) works.
impl From<i32> for Dim {
    fn from(n: i32) -> Dim {
        Dim::known(n.into())
    }
}

/// A `usize` above `i64::MAX` gives the overflow dim.
impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        i64::try_from(n).map_or_else(|_| Dim::overflow(), Dim::known)
    }
}

macro_rules! binop {
    ($trait:ident, $method:ident, $inner:ident) => {
        impl $trait<&Dim> for &Dim {
            type Output = Dim;
            fn $method(self, rhs: &Dim) -> Dim {
                self.$inner(rhs)
            }
        }
        impl $trait<Dim> for Dim {
            type Output = Dim;
            fn $method(self, rhs: Dim) -> Dim {
                self.$inner(&rhs)
            }
        }
        impl $trait<&Dim> for Dim {
            type Output = Dim;
            fn $method(self, rhs: &Dim) -> Dim {
                self.$inner(rhs)
            }
        }
        impl $trait<Dim> for &Dim {
            type Output = Dim;
            fn $method(self, rhs: Dim) -> Dim {
                self.$inner(&rhs)
            }
        }
        impl $trait<i64> for Dim {
            type Output = Dim;
            fn $method(self, rhs: i64) -> Dim {
                self.$inner(&Dim::known(rhs))
            }
        }
        impl $trait<i64> for &Dim {
            type Output = Dim;
            fn $method(self, rhs: i64) -> Dim {
                self.$inner(&Dim::known(rhs))
            }
        }
    };
}

impl Dim {
    fn sub_dim(&self, other: &Dim) -> Dim {
        self.add_dim(&other.neg_dim())
    }
}

binop!(Add, add, add_dim);
binop!(Sub, sub, sub_dim);
binop!(Mul, mul, mul_dim);

impl Neg for Dim {
    type Output = Dim;
    fn neg(self) -> Dim {
        self.neg_dim()
    }
}

impl Neg for &Dim {
    type Output = Dim;
    fn neg(self) -> Dim {
        self.neg_dim()
    }
}

impl Sum for Dim {
    fn sum<I: Iterator<Item = Dim>>(iter: I) -> Dim {
        iter.fold(Dim::known(0), |acc, d| acc + d)
    }
}

impl<'a> Sum<&'a Dim> for Dim {
    fn sum<I: Iterator<Item = &'a Dim>>(iter: I) -> Dim {
        iter.fold(Dim::known(0), |acc, d| acc + d)
    }
}

impl Product for Dim {
    fn product<I: Iterator<Item = Dim>>(iter: I) -> Dim {
        iter.fold(Dim::known(1), |acc, d| acc * d)
    }
}

impl<'a> Product<&'a Dim> for Dim {
    fn product<I: Iterator<Item = &'a Dim>>(iter: I) -> Dim {
        iter.fold(Dim::known(1), |acc, d| acc * d)
    }
}

#[cfg(test)]
#[path = "dim_tests.rs"]
mod tests;
