//! Recurrent layers (ONNX `LSTM` and `GRU`) over a whole sequence.
//!
//! The input projections of every timestep and direction are one GEMM on
//! the packed `W` (bias fused in); each step then multiplies the state by the
//! packed `R` of its direction (a GEMV at batch 1) and applies the gates
//! elementwise. Layout is ONNX's `layout = 0`: `X [seq, batch, input]`,
//! states `[dirs, batch, hidden]`.
//!
//! The step's destination holds its outputs and its workspace, in this
//! order (see [`RnnDims::out_len`]): `Y [seq, dirs, batch, hidden]`,
//! `Y_h [dirs, batch, hidden]`, `Y_c` (LSTM only, like `Y_h`), the input
//! projections `[seq * batch, dirs * gates * hidden]`, a block of
//! `batch * gates * hidden` for the recurrent products and one of
//! `(batch + 1) * gates * hidden` for GRU's gates.

use super::gemm::{gemm_packed, Epilogue, PackedB};
use super::math;
use super::parallel::{try_for_each_block, Blocks, Parallel};
use super::Isa;
use crate::error::{Error, Result};

/// Which recurrent cell, with its variant attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RnnCell {
    /// Gates `i, o, f, c`; `input_forget` couples `f = 1 - i`; `peepholes`:
    /// a `P [dirs, 3 * hidden]` input (`i, o, f`).
    Lstm { input_forget: bool, peepholes: bool },
    /// Gates `z, r, h`; `linear_before_reset`: `r ⊙ (H·Rhᵀ + Rbh)` instead of
    /// `(r ⊙ H)·Rhᵀ`.
    Gru { linear_before_reset: bool },
}

impl RnnCell {
    pub fn gates(self) -> usize {
        match self {
            RnnCell::Lstm { .. } => 4,
            RnnCell::Gru { .. } => 3,
        }
    }

    /// Activations per direction (`f, g, h` for LSTM, `f, g` for GRU).
    pub fn activations(self) -> usize {
        match self {
            RnnCell::Lstm { .. } => 3,
            RnnCell::Gru { .. } => 2,
        }
    }

    pub fn onnx_name(self) -> &'static str {
        match self {
            RnnCell::Lstm { .. } => "LSTM",
            RnnCell::Gru { .. } => "GRU",
        }
    }

    /// How many packed recurrent weights each direction has: GRU without
    /// `linear_before_reset` needs `R_zr` and `R_h` apart (`r` comes first).
    pub fn r_parts(self) -> usize {
        match self {
            RnnCell::Gru {
                linear_before_reset: false,
            } => 2,
            _ => 1,
        }
    }

    /// The `(first row, rows)` of `R [gates * hidden, hidden]` each packed
    /// part of one direction covers.
    pub fn r_part_rows(self, hidden: usize) -> Vec<(usize, usize)> {
        match self.r_parts() {
            2 => vec![(0, 2 * hidden), (2 * hidden, hidden)],
            _ => vec![(0, self.gates() * hidden)],
        }
    }
}

/// ONNX's `direction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RnnDirection {
    Forward,
    Reverse,
    Bidirectional,
}

impl RnnDirection {
    pub fn count(self) -> usize {
        match self {
            RnnDirection::Bidirectional => 2,
            _ => 1,
        }
    }

    /// Whether direction `d` (0 or 1) runs from the last step to the first.
    fn reversed(self, d: usize) -> bool {
        self == RnnDirection::Reverse || (self == RnnDirection::Bidirectional && d == 1)
    }
}

/// The activation functions ONNX allows in recurrent layers, with their
/// `activation_alpha` / `activation_beta` resolved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RnnActivation {
    Sigmoid,
    Tanh,
    Relu,
    /// `alpha · x + beta`.
    Affine(f32, f32),
    LeakyRelu(f32),
    /// `x > alpha ? x : 0`.
    ThresholdedRelu(f32),
    /// `alpha · tanh(beta · x)`.
    ScaledTanh(f32, f32),
    /// `max(0, min(1, alpha · x + beta))`.
    HardSigmoid(f32, f32),
    Elu(f32),
    Softsign,
    Softplus,
}

impl RnnActivation {
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            RnnActivation::Sigmoid => math::sigmoid(x),
            RnnActivation::Tanh => math::tanh(x),
            RnnActivation::Relu => x.max(0.0),
            RnnActivation::Affine(a, b) => a * x + b,
            RnnActivation::LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            RnnActivation::ThresholdedRelu(a) => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            RnnActivation::ScaledTanh(a, b) => a * math::tanh(b * x),
            RnnActivation::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            RnnActivation::Elu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * (math::exp(x) - 1.0)
                }
            }
            RnnActivation::Softsign => x / (1.0 + x.abs()),
            // ln(1 + e^x), +inf once e^x overflows, as ORT computes it.
            RnnActivation::Softplus => math::exp(x).ln_1p(),
        }
    }
}

/// A recurrent layer's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct RnnSpec {
    pub cell: RnnCell,
    pub direction: RnnDirection,
    pub hidden: usize,
    /// `cell.activations()` per direction, direction 0 first.
    pub activations: Vec<RnnActivation>,
    /// Gate pre-activations are clipped to `[-clip, clip]`.
    pub clip: Option<f32>,
}

impl RnnSpec {
    pub fn is_valid(&self) -> bool {
        self.hidden > 0
            && self.activations.len() == self.cell.activations() * self.direction.count()
            && self.clip.is_none_or(|c| c >= 0.0)
    }
}

/// The sizes of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RnnDims {
    pub seq: usize,
    pub batch: usize,
    pub input: usize,
}

/// Element offsets of the parts of the destination.
struct OutParts {
    y: usize,
    y_h: usize,
    y_c: usize,
    xw: usize,
    gates: usize,
    tmp: usize,
    /// The directions' own areas (bidirectional layers only).
    area: usize,
    end: usize,
}

impl RnnDims {
    fn parts(&self, spec: &RnnSpec) -> Option<OutParts> {
        let dirs = spec.direction.count();
        let state = dirs.checked_mul(self.batch)?.checked_mul(spec.hidden)?;
        let gh = spec.cell.gates().checked_mul(spec.hidden)?;
        let y = 0;
        let y_h = self.seq.checked_mul(state)?;
        let y_c = y_h.checked_add(state)?;
        let xw = match spec.cell {
            RnnCell::Lstm { .. } => y_c.checked_add(state)?,
            RnnCell::Gru { .. } => y_c,
        };
        let gates = xw.checked_add(self.seq.checked_mul(self.batch)?.checked_mul(dirs)?.checked_mul(gh)?)?;
        let tmp = gates.checked_add(self.batch.checked_mul(gh)?)?;
        // GRU: z and r, r ⊙ H, and one row of candidates.
        let area = tmp.checked_add(self.batch.checked_mul(gh)?)?.checked_add(gh)?;
        // Bidirectional: each direction's own Y, states and step buffers, so
        // that two threads can run the directions at once.
        let end = match spec.direction {
            RnnDirection::Bidirectional => area.checked_add(2usize.checked_mul(self.direction_area(spec)?)?)?,
            _ => area,
        };
        Some(OutParts {
            y,
            y_h,
            y_c,
            xw,
            gates,
            tmp,
            area,
            end,
        })
    }

    /// Elements of one direction's area (see [`rnn`]): `Y` of the direction
    /// `[seq, batch, hidden]`, its `H` and `C`, then `gates` and `tmp` as
    /// in the shared workspace.
    fn direction_area(&self, spec: &RnnSpec) -> Option<usize> {
        let state = self.batch.checked_mul(spec.hidden)?;
        let gh = spec.cell.gates().checked_mul(spec.hidden)?;
        let step = self.batch.checked_mul(gh)?.checked_mul(2)?.checked_add(gh)?;
        self.seq.checked_mul(state)?.checked_add(2 * state)?.checked_add(step)
    }

    /// Elements of the destination (outputs and workspace), `None` on
    /// overflow. [`rnn`] also takes a destination without the directions'
    /// areas (the length before they were added, as a context file written
    /// by an earlier kiln holds it); its directions then run one after the other.
    pub fn out_len(&self, spec: &RnnSpec) -> Option<usize> {
        self.parts(spec).map(|p| p.end)
    }

    /// Element offsets of `Y`, `Y_h` and `Y_c` in the destination.
    pub fn output_offsets(&self, spec: &RnnSpec) -> Option<[usize; 3]> {
        self.parts(spec).map(|p| [p.y, p.y_h, p.y_c])
    }
}

/// The inputs of one run; the optional ones as the op's node had them.
pub struct RnnArgs<'a> {
    /// `[seq, batch, input]`.
    pub x: &'a [f32],
    /// `W` of all directions: `k = input`, `n = dirs * gates * hidden`.
    pub w: &'a PackedB,
    /// Per direction, the parts of [`RnnCell::r_part_rows`].
    pub r: Vec<&'a PackedB>,
    /// Added to the input projections: `[dirs * gates * hidden]`.
    pub bias: Option<&'a [f32]>,
    /// GRU with `linear_before_reset`: `Rbh [dirs * hidden]`.
    pub rbh: Option<&'a [f32]>,
    /// `[batch]`, each in `0..=seq`.
    pub seq_lens: Option<&'a [i32]>,
    pub initial_h: Option<&'a [f32]>,
    pub initial_c: Option<&'a [f32]>,
    /// LSTM peepholes `[dirs * 3 * hidden]`.
    pub p: Option<&'a [f32]>,
}

/// Whether buffers of these lengths fit `spec` at `dims` (`lens` in the
/// order of [`RnnArgs`]' slices: x, bias, rbh, seq_lens, h, c, p; `dst`).
pub fn sizes_fit(spec: &RnnSpec, dims: &RnnDims, lens: &RnnLens) -> bool {
    let dirs = spec.direction.count();
    let h = spec.hidden;
    let gh = spec.cell.gates() * h;
    let state = dirs * dims.batch * h;
    let opt = |len: Option<usize>, want: usize| len.is_none_or(|l| l == want);
    let is_lstm = matches!(spec.cell, RnnCell::Lstm { .. });
    let lbr = matches!(
        spec.cell,
        RnnCell::Gru {
            linear_before_reset: true
        }
    );
    let peep = matches!(spec.cell, RnnCell::Lstm { peepholes: true, .. });
    spec.is_valid()
        && dims
            .parts(spec)
            .is_some_and(|p| lens.dst == p.end || lens.dst == p.area)
        && dims.seq.checked_mul(dims.batch).and_then(|n| n.checked_mul(dims.input)) == Some(lens.x)
        && opt(lens.bias, dirs * gh)
        && opt(lens.rbh, dirs * h)
        && (lens.rbh.is_some() == lbr)
        && opt(lens.seq_lens, dims.batch)
        && opt(lens.initial_h, state)
        && opt(lens.initial_c, state)
        && (is_lstm || lens.initial_c.is_none())
        && opt(lens.p, dirs * 3 * h)
        && (lens.p.is_some() == peep)
}

/// Buffer lengths in elements, for [`sizes_fit`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RnnLens {
    pub x: usize,
    pub bias: Option<usize>,
    pub rbh: Option<usize>,
    pub seq_lens: Option<usize>,
    pub initial_h: Option<usize>,
    pub initial_c: Option<usize>,
    pub p: Option<usize>,
    pub dst: usize,
}

fn size_error(what: impl std::fmt::Display) -> Error {
    Error::runtime(format!("recurrent layer: {what}"))
}

/// Runs the layer over the whole sequence into `dst` (see the module doc).
pub fn rnn(
    isa: Isa,
    spec: &RnnSpec,
    dims: &RnnDims,
    a: &RnnArgs<'_>,
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    let lens = RnnLens {
        x: a.x.len(),
        bias: a.bias.map(<[f32]>::len),
        rbh: a.rbh.map(<[f32]>::len),
        seq_lens: a.seq_lens.map(<[i32]>::len),
        initial_h: a.initial_h.map(<[f32]>::len),
        initial_c: a.initial_c.map(<[f32]>::len),
        p: a.p.map(<[f32]>::len),
        dst: dst.len(),
    };
    if !sizes_fit(spec, dims, &lens) {
        return Err(size_error(format_args!(
            "buffers {lens:?} do not fit {spec:?} at {dims:?}"
        )));
    }
    let dirs = spec.direction.count();
    let (h, gh) = (spec.hidden, spec.cell.gates() * spec.hidden);
    if a.w.k() != dims.input || a.w.n() != dirs * gh || a.r.len() != dirs * spec.cell.r_parts() {
        return Err(size_error("packed weights do not fit the layer"));
    }
    for (i, r) in a.r.iter().enumerate() {
        let (_, rows) = spec.cell.r_part_rows(h)[i % spec.cell.r_parts()];
        if r.k() != h || r.n() != rows {
            return Err(size_error("packed recurrent weights do not fit the layer"));
        }
    }
    let lens_of = seq_lengths(a.seq_lens, dims)?;
    let parts = dims.parts(spec).ok_or_else(|| size_error("too large"))?;
    // Nothing of the destination survives from an earlier run: outputs past a
    // sequence's length are zero.
    dst[..parts.xw].fill(0.0);
    let (outs, work) = dst.split_at_mut(parts.xw);
    let (xw, work) = work.split_at_mut(parts.gates - parts.xw);
    let (gates, work) = work.split_at_mut(parts.tmp - parts.gates);
    // Empty for one direction, and in a destination without the areas.
    let (tmp, area) = work.split_at_mut(parts.area - parts.tmp);
    // Not all of it is used by every cell: the whole destination stays deterministic.
    tmp.fill(0.0);
    area.fill(0.0);
    let rows = dims.seq * dims.batch;
    let epi = Epilogue {
        bias: match a.bias {
            Some(b) => super::gemm::Bias::PerColumn(b),
            None => super::gemm::Bias::None,
        },
        ..Epilogue::PLAIN
    };
    gemm_packed(isa, rows, a.x, dims.input, a.w, xw, dirs * gh, &epi, par)?;
    let (y, states) = outs.split_at_mut(parts.y_h);
    let state = dirs * dims.batch * h;
    let (y_h, y_c) = states.split_at_mut(state);
    if let Some(h0) = a.initial_h {
        y_h.copy_from_slice(h0);
    }
    if let Some(c0) = a.initial_c {
        y_c.copy_from_slice(c0);
    }
    let direction = |d: usize| Direction {
        isa,
        spec,
        dims,
        d,
        lens: &lens_of,
        xw,
        r: &a.r[d * spec.cell.r_parts()..(d + 1) * spec.cell.r_parts()],
        rbh: a.rbh.map(|b| &b[d * h..(d + 1) * h]),
        p: a.p.map(|p| &p[d * 3 * h..(d + 1) * 3 * h]),
    };
    // Two threads take a direction each where one step's product is too
    // small to split (the steps would run on one thread); a bigger one is
    // split per step, each thread keeping its columns of R in its own L2
    // (hidden 512: R is 4 MiB per direction, 2.4x faster on 2 threads).
    let small_steps = par.threads() >= 2 && step_parallelism(dims.batch, h, spec.cell.gates(), par).threads() == 1;
    if dirs == 2 && small_steps && !area.is_empty() {
        let (h0, c0) = (&*y_h, &*y_c);
        let per = area.len() / 2;
        try_for_each_block(par, area, Blocks::new(2 * per, per, per), &|d, block| {
            direction(d).run_alone(block, h0, c0)
        })?;
        gather_directions(spec, dims, area, y, y_h, y_c);
    } else {
        for d in 0..dirs {
            let hs = &mut y_h[d * dims.batch * h..(d + 1) * dims.batch * h];
            let cs = match spec.cell {
                RnnCell::Lstm { .. } => Some(&mut y_c[d * dims.batch * h..(d + 1) * dims.batch * h]),
                RnnCell::Gru { .. } => None,
            };
            direction(d).steps((&mut *y, dirs, d), hs, cs, gates, tmp, par)?;
        }
    }
    // A sequence of length 0 has no last state: ORT gives zeros.
    for (b, &len) in lens_of.iter().enumerate() {
        if len == 0 {
            for d in 0..dirs {
                let at = (d * dims.batch + b) * h;
                y_h[at..at + h].fill(0.0);
                if matches!(spec.cell, RnnCell::Lstm { .. }) {
                    y_c[at..at + h].fill(0.0);
                }
            }
        }
    }
    Ok(())
}

/// Copies each direction's `Y`, `H` and `C` from its area (see
/// [`Direction::run_alone`]) into the outputs.
fn gather_directions(spec: &RnnSpec, dims: &RnnDims, area: &[f32], y: &mut [f32], y_h: &mut [f32], y_c: &mut [f32]) {
    let state = dims.batch * spec.hidden;
    let per = area.len() / 2;
    for d in 0..2 {
        let own = &area[d * per..(d + 1) * per];
        for t in 0..dims.seq {
            let at = (t * 2 + d) * state;
            y[at..at + state].copy_from_slice(&own[t * state..(t + 1) * state]);
        }
        let states = &own[dims.seq * state..];
        y_h[d * state..(d + 1) * state].copy_from_slice(&states[..state]);
        if matches!(spec.cell, RnnCell::Lstm { .. }) {
            y_c[d * state..(d + 1) * state].copy_from_slice(&states[state..2 * state]);
        }
    }
}

/// Each batch entry's length, checked against the sequence.
fn seq_lengths(seq_lens: Option<&[i32]>, dims: &RnnDims) -> Result<Vec<usize>> {
    let Some(lens) = seq_lens else {
        return Ok(vec![dims.seq; dims.batch]);
    };
    lens.iter()
        .map(|&l| match usize::try_from(l) {
            Ok(l) if l <= dims.seq => Ok(l),
            _ => Err(Error::runtime(format!(
                "sequence_lens holds {l}, outside 0..={} (the sequence length of X)",
                dims.seq
            ))),
        })
        .collect()
}

/// One direction of one run.
struct Direction<'a> {
    isa: Isa,
    spec: &'a RnnSpec,
    dims: &'a RnnDims,
    d: usize,
    lens: &'a [usize],
    xw: &'a [f32],
    r: &'a [&'a PackedB],
    rbh: Option<&'a [f32]>,
    p: Option<&'a [f32]>,
}

impl Direction<'_> {
    /// Runs every timestep: `hs` (and `cs`) hold this direction's state
    /// `[batch, hidden]` throughout and its final value at the end; `H` of
    /// time `t` goes to row `t · y_dirs + y_d` of `y`'s `[batch, hidden]` blocks.
    fn steps(
        &self,
        (y, y_dirs, y_d): (&mut [f32], usize, usize),
        hs: &mut [f32],
        mut cs: Option<&mut [f32]>,
        gates: &mut [f32],
        tmp: &mut [f32],
        par: &dyn Parallel,
    ) -> Result<()> {
        let (seq, batch, h) = (self.dims.seq, self.dims.batch, self.spec.hidden);
        let reversed = self.spec.direction.reversed(self.d);
        let par = step_parallelism(batch, h, self.spec.cell.gates(), par);
        for s in 0..seq {
            let t = if reversed { seq - 1 - s } else { s };
            match (self.spec.cell, cs.as_deref_mut()) {
                (RnnCell::Lstm { .. }, Some(c)) => self.lstm_step(t, hs, c, gates, par)?,
                _ => self.gru_step(t, hs, gates, tmp, par)?,
            }
            for b in 0..batch {
                if t < self.lens[b] {
                    let at = ((t * y_dirs + y_d) * batch + b) * h;
                    y[at..at + h].copy_from_slice(&hs[b * h..(b + 1) * h]);
                }
            }
        }
        Ok(())
    }

    /// Runs this direction of a bidirectional layer in its own `area`
    /// (`Y [seq, batch, hidden]`, `H`, `C`, step buffers), one thread:
    /// the initial states come from the outputs `y_h`, `y_c` (set by [`rnn`]).
    fn run_alone(&self, area: &mut [f32], y_h: &[f32], y_c: &[f32]) -> Result<()> {
        let (seq, state) = (self.dims.seq, self.dims.batch * self.spec.hidden);
        let gh = self.spec.cell.gates() * self.spec.hidden;
        let (y, rest) = area.split_at_mut(seq * state);
        let (hs, rest) = rest.split_at_mut(state);
        let (cs, rest) = rest.split_at_mut(state);
        let (gates, tmp) = rest.split_at_mut(self.dims.batch * gh);
        hs.copy_from_slice(&y_h[self.d * state..(self.d + 1) * state]);
        let cs = match self.spec.cell {
            RnnCell::Lstm { .. } => {
                cs.copy_from_slice(&y_c[self.d * state..(self.d + 1) * state]);
                Some(cs)
            }
            RnnCell::Gru { .. } => None,
        };
        self.steps((y, 1, 0), hs, cs, gates, tmp, &super::parallel::Serial)
    }

    /// The input projection of gate `g` at time `t` for batch entry `b`.
    fn xw_row(&self, t: usize, b: usize) -> &[f32] {
        let gh = self.spec.cell.gates() * self.spec.hidden;
        let dirs = self.spec.direction.count();
        let at = (t * self.dims.batch + b) * dirs * gh + self.d * gh;
        &self.xw[at..at + gh]
    }

    fn act(&self, k: usize) -> RnnActivation {
        self.spec.activations[self.d * self.spec.cell.activations() + k]
    }

    /// `f` over a gate's pre-activations, clipped first.
    fn activate(&self, k: usize, x: &mut [f32]) {
        super::rnn_gate(self.isa, self.act(k), self.spec.clip, x);
    }

    fn lstm_step(&self, t: usize, hs: &mut [f32], cs: &mut [f32], gates: &mut [f32], par: &dyn Parallel) -> Result<()> {
        let (batch, h) = (self.dims.batch, self.spec.hidden);
        let gh = 4 * h;
        let gates = &mut gates[..batch * gh];
        gemm_packed(self.isa, batch, hs, h, self.r[0], gates, gh, &Epilogue::PLAIN, par)?;
        let input_forget = matches!(self.spec.cell, RnnCell::Lstm { input_forget: true, .. });
        let plain = self.p.is_none() && !input_forget;
        let default_cell = plain && self.spec.clip.is_none() && {
            use RnnActivation::{Sigmoid, Tanh};
            (self.act(0), self.act(1), self.act(2)) == (Sigmoid, Tanh, Tanh)
        };
        for b in 0..batch {
            if t >= self.lens[b] {
                continue;
            }
            let row = &mut gates[b * gh..(b + 1) * gh];
            let (c_prev, h_new) = (&mut cs[b * h..(b + 1) * h], &mut hs[b * h..(b + 1) * h]);
            if default_cell && super::lstm_cells(self.isa, row, self.xw_row(t, b), c_prev, h_new) {
                continue;
            }
            for (g, x) in row.iter_mut().zip(self.xw_row(t, b)) {
                *g += x;
            }
            // Gates i, o, f, c; peepholes i, o, f.
            if plain {
                // i, o and f share f(): one pass over the three.
                self.activate(0, &mut row[..3 * h]);
            }
            let (i, rest) = row.split_at_mut(h);
            let (o, rest) = rest.split_at_mut(h);
            let (f, c) = rest.split_at_mut(h);
            if !plain {
                self.gates_with_extras(i, f, c_prev, input_forget);
            }
            self.activate(1, c);
            // C = f ⊙ C + i ⊙ g, kept in the spent candidate gate too for h(C).
            for j in 0..h {
                let cj = f[j] * c_prev[j] + i[j] * c[j];
                c_prev[j] = cj;
                c[j] = cj;
            }
            if !plain {
                if let Some(p) = self.p {
                    for j in 0..h {
                        o[j] += p[h + j] * c_prev[j];
                    }
                }
                self.activate(0, o);
            }
            // H = o ⊙ h(C).
            super::rnn_gate(self.isa, self.act(2), None, c);
            for (hj, (oj, cj)) in h_new.iter_mut().zip(o.iter().zip(c.iter())) {
                *hj = oj * cj;
            }
        }
        Ok(())
    }

    /// Gates i and f where peepholes or coupled input and forget gates
    /// change them: `i += Pi ⊙ C`, `f += Pf ⊙ C` (previous C), then f(),
    /// and `f = 1 - i` if coupled.
    fn gates_with_extras(&self, i: &mut [f32], f: &mut [f32], c_prev: &[f32], input_forget: bool) {
        let h = i.len();
        if let Some(p) = self.p {
            for j in 0..h {
                i[j] += p[j] * c_prev[j];
                f[j] += p[2 * h + j] * c_prev[j];
            }
        }
        self.activate(0, i);
        if input_forget {
            for j in 0..h {
                f[j] = 1.0 - i[j];
            }
        } else {
            self.activate(0, f);
        }
    }

    fn gru_step(&self, t: usize, hs: &mut [f32], gates: &mut [f32], tmp: &mut [f32], par: &dyn Parallel) -> Result<()> {
        let (batch, h) = (self.dims.batch, self.spec.hidden);
        let lbr = self.r.len() == 1;
        // lbr: all three gates' H·Rᵀ at once; else z and r first.
        let width = if lbr { 3 * h } else { 2 * h };
        let hr = &mut gates[..batch * width];
        gemm_packed(self.isa, batch, hs, h, self.r[0], hr, width, &Epilogue::PLAIN, par)?;
        // z and r, kept in `tmp` as [batch, 2h]; `r ⊙ H` after them.
        let (zr, rest) = tmp.split_at_mut(batch * 2 * h);
        for b in 0..batch {
            let xw = self.xw_row(t, b);
            let row = &mut zr[b * 2 * h..(b + 1) * 2 * h];
            for (j, z) in row.iter_mut().enumerate() {
                *z = xw[j] + hr[b * width + j];
            }
            self.activate(0, row);
        }
        if !lbr {
            // (r ⊙ H)·Rhᵀ into the front of `gates` (H·R_zrᵀ is no longer needed).
            let rh = &mut rest[..batch * h];
            for (i, v) in rh.iter_mut().enumerate() {
                *v = zr[(i / h) * 2 * h + h + i % h] * hs[i];
            }
            gemm_packed(
                self.isa,
                batch,
                rh,
                h,
                self.r[1],
                &mut gates[..batch * h],
                h,
                &Epilogue::PLAIN,
                par,
            )?;
        }
        let cand = &mut rest[batch * h..batch * h + h];
        for b in 0..batch {
            if t >= self.lens[b] {
                continue;
            }
            let xw = self.xw_row(t, b);
            let row = &mut cand[..h];
            for (j, v) in row.iter_mut().enumerate() {
                let r = zr[b * 2 * h + h + j];
                *v = if lbr {
                    let rb = self.rbh.map_or(0.0, |rb| rb[j]);
                    xw[2 * h + j] + r * (gates[b * width + 2 * h + j] + rb)
                } else {
                    xw[2 * h + j] + gates[b * h + j]
                };
            }
            self.activate(1, row);
            for j in 0..h {
                let z = zr[b * 2 * h + j];
                let prev = hs[b * h + j];
                hs[b * h + j] = (1.0 - z) * row[j] + z * prev;
            }
        }
        Ok(())
    }
}

/// `x = f(clip(x))` for one gate, element by element (compiled per ISA by
/// `kernels::rnn_gate_isa`, so the loop vectorises).
#[inline(always)]
pub(super) fn gate(f: RnnActivation, clip: Option<f32>, x: &mut [f32]) {
    if let Some(c) = clip {
        for v in x.iter_mut() {
            *v = v.clamp(-c, c);
        }
    }
    macro_rules! each {
        ($e:expr) => {
            for v in x.iter_mut() {
                *v = $e(*v);
            }
        };
    }
    match f {
        RnnActivation::Sigmoid => each!(math::sigmoid),
        RnnActivation::Tanh => each!(math::tanh),
        other => each!(|v| other.apply(v)),
    }
}

/// The pool for one time step's `H·Rᵀ`: a step of a small layer (Silero
/// VAD's: 1×128 by 128×512) is a few microseconds of work on weights that
/// stay in cache, and waking a second thread for it at every step costs
/// more than it saves (2 threads ran 1.3× slower than 1).
fn step_parallelism(batch: usize, hidden: usize, gates: usize, par: &dyn Parallel) -> &dyn Parallel {
    const MIN_PARALLEL_MACS: usize = 1 << 20;
    if batch * hidden * gates * hidden < MIN_PARALLEL_MACS {
        &super::parallel::Serial
    } else {
        par
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::{ScopedThreads, Serial};
    use crate::target::Target;

    fn values(n: usize, seed: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0) * scale)
            .collect()
    }

    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    /// `W`/`R` row `row` of direction `d` times `v`.
    fn dot(m: &[f32], d: usize, rows: usize, cols: usize, row: usize, v: &[f64]) -> f64 {
        let at = (d * rows + row) * cols;
        m[at..at + cols].iter().zip(v).map(|(&a, &b)| a as f64 * b).sum()
    }

    /// A plain f64 LSTM / GRU (default activations, no clip) for one direction.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        cell: RnnCell,
        d: usize,
        reversed: bool,
        dims: &RnnDims,
        h: usize,
        x: &[f32],
        w: &[f32],
        r: &[f32],
        b: &[f32],
        lens: &[usize],
    ) -> (Vec<Vec<f64>>, Vec<f64>) {
        let g = cell.gates();
        let mut y = vec![vec![0.0; dims.batch * h]; dims.seq];
        let mut last = vec![0.0; dims.batch * h];
        for bi in 0..dims.batch {
            let (mut hs, mut cs) = (vec![0.0f64; h], vec![0.0f64; h]);
            for s in 0..lens[bi] {
                let t = if reversed { lens[bi] - 1 - s } else { s };
                let xt: Vec<f64> = (0..dims.input)
                    .map(|i| x[(t * dims.batch + bi) * dims.input + i] as f64)
                    .collect();
                let pre = |row: usize, hv: &[f64]| {
                    dot(w, d, g * h, dims.input, row, &xt)
                        + dot(r, d, g * h, h, row, hv)
                        + b[d * 2 * g * h + row] as f64
                        + b[d * 2 * g * h + g * h + row] as f64
                };
                let mut next = vec![0.0; h];
                match cell {
                    RnnCell::Lstm { .. } => {
                        for j in 0..h {
                            let i = sigmoid(pre(j, &hs));
                            let o = sigmoid(pre(h + j, &hs));
                            let f = sigmoid(pre(2 * h + j, &hs));
                            let c = pre(3 * h + j, &hs).tanh();
                            cs[j] = f * cs[j] + i * c;
                            next[j] = o * cs[j].tanh();
                        }
                    }
                    RnnCell::Gru { linear_before_reset } => {
                        let z: Vec<f64> = (0..h).map(|j| sigmoid(pre(j, &hs))).collect();
                        let rg: Vec<f64> = (0..h).map(|j| sigmoid(pre(h + j, &hs))).collect();
                        let rh: Vec<f64> = (0..h).map(|j| rg[j] * hs[j]).collect();
                        for j in 0..h {
                            let row = 2 * h + j;
                            let wb = b[d * 2 * g * h + row] as f64;
                            let rb = b[d * 2 * g * h + g * h + row] as f64;
                            let xw = dot(w, d, g * h, dims.input, row, &xt) + wb;
                            let cand = if linear_before_reset {
                                xw + rg[j] * (dot(r, d, g * h, h, row, &hs) + rb)
                            } else {
                                xw + dot(r, d, g * h, h, row, &rh) + rb
                            };
                            next[j] = (1.0 - z[j]) * cand.tanh() + z[j] * hs[j];
                        }
                    }
                }
                hs = next;
                y[t][bi * h..(bi + 1) * h].copy_from_slice(&hs);
            }
            last[bi * h..(bi + 1) * h].copy_from_slice(&hs);
        }
        (y, last)
    }

    #[test]
    fn matches_a_plain_reference_on_every_target() {
        // Hidden 6: the fused LSTM cells' partial vector alone; 37: whole
        // vectors of 8 and 16 lanes and a partial one.
        for h in [6, 37] {
            matches_reference_at(h);
        }
    }

    fn matches_reference_at(h: usize) {
        let dims = RnnDims {
            seq: 4,
            batch: 3,
            input: 5,
        };
        let cells = [
            RnnCell::Lstm {
                input_forget: false,
                peepholes: false,
            },
            RnnCell::Gru {
                linear_before_reset: false,
            },
            RnnCell::Gru {
                linear_before_reset: true,
            },
        ];
        let lens = [4usize, 0, 2];
        let lens32: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
        for isa in Target::ALL.into_iter().filter_map(Isa::new) {
            for cell in cells {
                let spec = RnnSpec {
                    cell,
                    direction: RnnDirection::Bidirectional,
                    hidden: h,
                    activations: match cell {
                        RnnCell::Lstm { .. } => {
                            [RnnActivation::Sigmoid, RnnActivation::Tanh, RnnActivation::Tanh].repeat(2)
                        }
                        RnnCell::Gru { .. } => [RnnActivation::Sigmoid, RnnActivation::Tanh].repeat(2),
                    },
                    clip: None,
                };
                let g = cell.gates();
                let x = values(dims.seq * dims.batch * dims.input, 1, 1.0);
                let w = values(2 * g * h * dims.input, 2, 0.6);
                let r = values(2 * g * h * h, 3, 0.6);
                let b = values(2 * 2 * g * h, 4, 0.5);
                let target = isa.target();
                let wp = PackedB::pack(target, &w, dims.input, 2 * g * h, true);
                let mut rp = Vec::new();
                for d in 0..2 {
                    for (first, rows) in cell.r_part_rows(h) {
                        let at = (d * g * h + first) * h;
                        rp.push(PackedB::pack(target, &r[at..at + rows * h], h, rows, true));
                    }
                }
                let lbr = cell
                    == (RnnCell::Gru {
                        linear_before_reset: true,
                    });
                let (mut row, mut rbh) = (Vec::new(), Vec::new());
                for d in 0..2 {
                    for j in 0..g * h {
                        let (wb, rb) = (b[d * 2 * g * h + j], b[d * 2 * g * h + g * h + j]);
                        row.push(if lbr && j >= 2 * h { wb } else { wb + rb });
                    }
                    if lbr {
                        rbh.extend_from_slice(&b[d * 2 * g * h + 2 * g * h - h..(d + 1) * 2 * g * h]);
                    }
                }
                let args = RnnArgs {
                    x: &x,
                    w: &wp,
                    r: rp.iter().collect(),
                    bias: Some(&row),
                    rbh: lbr.then_some(&rbh[..]),
                    seq_lens: Some(&lens32),
                    initial_h: None,
                    initial_c: None,
                    p: None,
                };
                let run = |len: usize, par: &dyn Parallel| {
                    let mut out = vec![f32::NAN; len];
                    rnn(isa, &spec, &dims, &args, &mut out, par).unwrap();
                    out
                };
                let dst = run(dims.out_len(&spec).unwrap(), &Serial);
                let [_, y_h, _] = dims.output_offsets(&spec).unwrap();
                let outputs = y_h + 2 * dims.batch * h * if g == 4 { 2 } else { 1 };
                let same_outputs = |other: &[f32]| {
                    dst[..outputs]
                        .iter()
                        .zip(&other[..outputs])
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                };
                // Two threads run the directions at once, each in its own
                // area: the same operations, so the same outputs bit for bit.
                let two = run(dst.len(), &ScopedThreads(2));
                assert!(same_outputs(&two), "{cell:?} {isa:?}: two threads differ");
                // A destination without the directions' areas (a context
                // written before they existed): directions one after the other.
                let old_len = dims.parts(&spec).unwrap().area;
                assert!(old_len < dst.len());
                let old = run(old_len, &ScopedThreads(2));
                assert!(same_outputs(&old), "{cell:?} {isa:?}: the short destination differs");
                for d in 0..2 {
                    let (y, last) = reference(cell, d, d == 1, &dims, h, &x, &w, &r, &b, &lens);
                    for t in 0..dims.seq {
                        for i in 0..dims.batch * h {
                            let got = dst[((t * 2 + d) * dims.batch) * h + i] as f64;
                            assert!(
                                (got - y[t][i]).abs() < 1e-5,
                                "{cell:?} {isa:?} d{d} t{t} {i}: {got} vs {}",
                                y[t][i]
                            );
                        }
                    }
                    for i in 0..dims.batch * h {
                        let got = dst[y_h + d * dims.batch * h + i] as f64;
                        assert!((got - last[i]).abs() < 1e-5, "{cell:?} {isa:?} Y_h d{d} {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn refuses_buffers_that_do_not_fit() {
        let spec = RnnSpec {
            cell: RnnCell::Gru {
                linear_before_reset: false,
            },
            direction: RnnDirection::Forward,
            hidden: 2,
            activations: vec![RnnActivation::Sigmoid, RnnActivation::Tanh],
            clip: None,
        };
        let dims = RnnDims {
            seq: 2,
            batch: 1,
            input: 3,
        };
        let lens = RnnLens {
            x: 6,
            dst: dims.out_len(&spec).unwrap(),
            ..RnnLens::default()
        };
        assert!(sizes_fit(&spec, &dims, &lens));
        assert!(!sizes_fit(&spec, &dims, &RnnLens { x: 5, ..lens }));
        assert!(!sizes_fit(
            &spec,
            &dims,
            &RnnLens {
                dst: lens.dst - 1,
                ..lens
            }
        ));
        // An LSTM-only input on a GRU, a missing Rbh for linear_before_reset.
        assert!(!sizes_fit(
            &spec,
            &dims,
            &RnnLens {
                initial_c: Some(2),
                ..lens
            }
        ));
        let lbr = RnnSpec {
            cell: RnnCell::Gru {
                linear_before_reset: true,
            },
            ..spec.clone()
        };
        assert!(!sizes_fit(&lbr, &dims, &lens));
        assert!(sizes_fit(&lbr, &dims, &RnnLens { rbh: Some(2), ..lens }));
    }
}
