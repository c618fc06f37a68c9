//! Static shapes: display and broadcasting. Symbolic shapes are slices of
//! [`Dim`](super::Dim); see [`broadcast_dims`](super::broadcast_dims).

use std::fmt;

use super::Dim;

/// Formats a shape as `[2,3,4]`.
pub struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_dims(f, self.0)
    }
}

/// Formats a symbolic shape as `[batch,seq*2,768]`.
pub struct DimsDisplay<'a>(pub &'a [Dim]);

impl fmt::Display for DimsDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_dims(f, self.0)
    }
}

/// `[a,b,c]`, without spaces (as ONNX tools print shapes).
fn write_dims<T: fmt::Display>(f: &mut fmt::Formatter<'_>, dims: &[T]) -> fmt::Result {
    f.write_str("[")?;
    for (i, d) in dims.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{d}")?;
    }
    f.write_str("]")
}

/// The shape of `a op b` under ONNX multidirectional (NumPy) broadcasting.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        // Right-align: missing leading dims count as 1.
        let pad = rank - s.len();
        if i < pad {
            1
        } else {
            s[i - pad]
        }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_display_as_lists() {
        assert_eq!(ShapeDisplay(&[2, 3, 4]).to_string(), "[2,3,4]");
        assert_eq!(ShapeDisplay(&[]).to_string(), "[]");
        let dims = [Dim::sym("batch"), Dim::sym("seq") * 2, Dim::known(768)];
        assert_eq!(DimsDisplay(&dims).to_string(), "[batch,2*seq,768]");
    }

    #[test]
    fn static_broadcasting_follows_onnx() {
        assert_eq!(broadcast_shapes(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]));
        assert_eq!(broadcast_shapes(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast_shapes(&[0], &[1]), Some(vec![0]));
        assert_eq!(broadcast_shapes(&[2], &[3]), None);
    }
}
