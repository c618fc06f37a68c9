//! The sliding window of convolutions and pools, shared by their kernels.
//!
//! kiln runs spatial ops channels-last: activations are `[N, H, W, C]`
//! (1-D ops use `H = 1`), so the channel dim is contiguous for SIMD and a
//! convolution is a GEMM with the packed weights as its B operand. The
//! importer wraps each spatial op in transposes from and to ONNX's NCHW,
//! and the compiler cancels the pairs between consecutive spatial ops.

/// One spatial axis of a window: kernel size, stride, dilation, padding
/// before and after, and the input and output lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Axis {
    pub input: usize,
    pub output: usize,
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    pub pad_begin: usize,
    pub pad_end: usize,
}

impl Axis {
    /// The span the dilated kernel covers.
    pub fn extent(&self) -> usize {
        (self.kernel - 1) * self.dilation + 1
    }

    /// The input index of output `o`'s kernel tap `k`, or `None` in padding.
    #[inline]
    pub fn source(&self, o: usize, k: usize) -> Option<usize> {
        let i = (o * self.stride + k * self.dilation).checked_sub(self.pad_begin)?;
        (i < self.input).then_some(i)
    }

    /// The first and one-past-last outputs whose taps all read inside the
    /// input (an empty range, `lo == hi`, when there are none).
    pub fn interior_outputs(&self) -> (usize, usize) {
        let lo = self.pad_begin.div_ceil(self.stride);
        // Largest o with o·stride + extent − pad_begin <= input.
        let hi = match (self.input + self.pad_begin).checked_sub(self.extent()) {
            Some(span) => (span / self.stride + 1).min(self.output),
            None => 0,
        };
        (lo.min(hi), hi)
    }

    /// Whether every tap of output `o` reads inside the input.
    pub fn interior(&self, o: usize) -> bool {
        let start = o * self.stride;
        start >= self.pad_begin && start + self.extent() - self.pad_begin <= self.input
    }
}

/// A 2-D window over `[N, H, W, C]` (1-D: `h` has kernel, input and output 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub h: Axis,
    pub w: Axis,
}

impl Window {
    pub fn taps(&self) -> usize {
        self.h.kernel * self.w.kernel
    }

    pub fn output_pixels(&self) -> usize {
        self.h.output * self.w.output
    }

    pub fn input_pixels(&self) -> usize {
        self.h.input * self.w.input
    }
}

/// The output length of a window over `input` with explicit pads, or `None`
/// when the padded input is shorter than the kernel's extent. `ceil_mode`
/// (pools) rounds up but never starts a window in the end padding.
pub fn output_len(
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    pads: (usize, usize),
    ceil_mode: bool,
) -> Option<usize> {
    let extent = (kernel.checked_sub(1)?) * dilation + 1;
    let padded = input + pads.0 + pads.1;
    let span = padded.checked_sub(extent)?;
    if !ceil_mode {
        return Some(span / stride + 1);
    }
    let mut out = span.div_ceil(stride) + 1;
    if (out - 1) * stride >= input + pads.0 {
        out -= 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lengths() {
        assert_eq!(output_len(224, 7, 2, 1, (3, 3), false), Some(112));
        assert_eq!(output_len(112, 3, 2, 1, (1, 1), false), Some(56));
        assert_eq!(output_len(5, 3, 1, 2, (0, 0), false), Some(1));
        assert_eq!(output_len(4, 3, 1, 2, (0, 0), false), None);
        // ceil_mode: 6 with k2 s2 → 3 either way; 5 → 2 floor, 3 ceil.
        assert_eq!(output_len(5, 2, 2, 1, (0, 0), false), Some(2));
        assert_eq!(output_len(5, 2, 2, 1, (0, 0), true), Some(3));
        // The last window would start in the end padding: dropped.
        assert_eq!(output_len(4, 2, 2, 1, (0, 1), true), Some(2));
    }

    #[test]
    fn interior_outputs_read_no_padding() {
        let axis = |input, kernel, stride, pad: (usize, usize)| Axis {
            input,
            output: output_len(input, kernel, stride, 1, pad, false).unwrap(),
            kernel,
            stride,
            dilation: 1,
            pad_begin: pad.0,
            pad_end: pad.1,
        };
        for a in [
            axis(7, 3, 1, (1, 1)),
            axis(14, 3, 2, (1, 1)),
            axis(2, 5, 1, (2, 2)),
            axis(9, 1, 1, (0, 0)),
        ] {
            let (lo, hi) = a.interior_outputs();
            for o in 0..a.output {
                assert_eq!((lo..hi).contains(&o), a.interior(o), "{a:?} output {o}");
            }
        }
        assert_eq!(axis(7, 3, 1, (1, 1)).interior_outputs(), (1, 6));
        assert_eq!(axis(2, 5, 1, (2, 2)).interior_outputs(), (0, 0));
    }

    #[test]
    fn sources_skip_padding() {
        let a = Axis {
            input: 4,
            output: 4,
            kernel: 3,
            stride: 1,
            dilation: 1,
            pad_begin: 1,
            pad_end: 1,
        };
        assert_eq!(a.source(0, 0), None);
        assert_eq!(a.source(0, 1), Some(0));
        assert_eq!(a.source(3, 2), None);
        assert!(!a.interior(0) && a.interior(1) && a.interior(2) && !a.interior(3));
    }
}
