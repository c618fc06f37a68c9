//! Embeddings summed and layer-normalised in one pass (issue #14): each
//! output row is `LayerNorm(((t0 + t1) + t2) …)`, where a term is a row of
//! a table picked by an index (a token's, a position's or a segment's
//! embedding) or a row of a value added as it is. One pass over the rows
//! instead of a gather per table, an add per term and the norm, each
//! writing the whole `[rows, width]` tensor.

use super::index::fix_index;
use super::norm;
use crate::error::Result;

/// Where a term's row for each output row comes from.
#[derive(Clone, Copy, Debug)]
pub enum Rows<'a> {
    /// Row `indices[o]` of a `[rows, width]` table (negative counts from the end).
    Gathered { table: &'a [f32], indices: Indices<'a> },
    /// Row `o` of a `[.., width]` value.
    Added(&'a [f32]),
}

impl Default for Rows<'_> {
    fn default() -> Self {
        Rows::Added(&[])
    }
}

/// Indices as the model gives them: no per-run conversion.
#[derive(Clone, Copy, Debug)]
pub enum Indices<'a> {
    I64(&'a [i64]),
    I32(&'a [i32]),
}

impl Indices<'_> {
    fn len(&self) -> usize {
        match self {
            Indices::I64(i) => i.len(),
            Indices::I32(i) => i.len(),
        }
    }

    fn get(&self, at: usize) -> i64 {
        match self {
            Indices::I64(i) => i[at],
            Indices::I32(i) => i[at].into(),
        }
    }
}

/// One summand: its rows, and for each of the output's leading dims the
/// step between its rows (in rows; 0 where it broadcasts). `o` above is
/// the sum of the output row's position times these strides.
#[derive(Clone, Copy, Debug, Default)]
pub struct Term<'a> {
    pub rows: Rows<'a>,
    pub strides: &'a [usize],
}

/// The sum's shape and normalisation: output `[lead.., width]`.
#[derive(Clone, Copy, Debug)]
pub struct EmbedShape<'a> {
    pub lead: &'a [usize],
    pub width: usize,
    pub epsilon: f32,
    pub decomposed: bool,
}

impl EmbedShape<'_> {
    pub fn rows(&self) -> usize {
        self.lead.iter().product()
    }

    /// Row `r`'s offset (in rows) into a term with `strides`.
    #[inline]
    fn offset(&self, mut r: usize, strides: &[usize]) -> usize {
        let mut off = 0;
        for (&d, &s) in self.lead.iter().zip(strides).rev() {
            off += r % d * s;
            r /= d;
        }
        off
    }
}

/// Whether a term of `len` rows holds every row that the output's rows
/// (`lead`) read through `strides`: one stride per dim, and (unless there
/// are no rows) the last row read below `len`. The kernel's run-time check
/// and a loaded program's validation both use it.
pub fn reads_fit(lead: &[usize], strides: &[usize], len: usize) -> bool {
    if strides.len() != lead.len() {
        return false;
    }
    if lead.contains(&0) {
        return true;
    }
    let last = lead
        .iter()
        .zip(strides)
        .try_fold(0usize, |acc, (&d, &s)| (d - 1).checked_mul(s)?.checked_add(acc));
    last.is_some_and(|l| l < len)
}

/// Checks that every term's reads stay inside it and every index is in its
/// table: errors here, so the row loop cannot fail or read out of bounds.
pub(super) fn check(shape: &EmbedShape<'_>, terms: &[Term<'_>], scale: &[f32], bias: Option<&[f32]>) -> Result<()> {
    let w = shape.width;
    let bad = |what: String| Err(super::length_error(format_args!("embedding layer norm: {what}")));
    if terms.is_empty() || scale.len() != w || bias.is_some_and(|b| b.len() != w) {
        return bad(format!(
            "{} terms, scale {} or bias for rows of {w}",
            terms.len(),
            scale.len()
        ));
    }
    if shape.rows() == 0 || w == 0 {
        return Ok(());
    }
    for (k, t) in terms.iter().enumerate() {
        let (whole, len) = match t.rows {
            Rows::Added(v) => (v.len().is_multiple_of(w), v.len() / w),
            Rows::Gathered { table, indices } => (table.len().is_multiple_of(w), indices.len()),
        };
        if !whole || !reads_fit(shape.lead, t.strides, len) {
            return bad(format!(
                "term {k} of {len} rows read through strides {:?} over {:?}",
                t.strides, shape.lead
            ));
        }
        if let Rows::Gathered { table, indices } = t.rows {
            for at in 0..indices.len() {
                fix_index("Gather", indices.get(at), table.len() / w)?;
            }
        }
    }
    Ok(())
}

/// Output rows `first..` into `dst` (whole rows), after [`check`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn embed_rows(
    shape: &EmbedShape<'_>,
    terms: &[Term<'_>],
    scale: &[f32],
    bias: Option<&[f32]>,
    first: usize,
    dst: &mut [f32],
) {
    let w = shape.width;
    for (r, row) in (first..).zip(dst.chunks_exact_mut(w)) {
        for (k, t) in terms.iter().enumerate() {
            let at = shape.offset(r, t.strides);
            let src = match t.rows {
                Rows::Added(v) => &v[at * w..(at + 1) * w],
                Rows::Gathered { table, indices } => {
                    // In range: `check` saw every index.
                    let j = fix_index("Gather", indices.get(at), table.len() / w).unwrap_or(0);
                    &table[j * w..(j + 1) * w]
                }
            };
            // The graph's order: the first term, then each added in turn.
            if k == 0 {
                row.copy_from_slice(src);
            } else {
                for (o, &x) in row.iter_mut().zip(src) {
                    *o += x;
                }
            }
        }
        norm::layer_norm_row(row, shape.epsilon, shape.decomposed, scale, bias);
    }
}
