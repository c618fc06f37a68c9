//! Element types.

use std::fmt;

/// An element type kiln can hold. Compute is f32; the integer types and
/// bool carry shapes, indices and masks; float16 crosses partition edges
/// and is cast and moved, never computed on (see `ir::check`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    I64,
    I32,
    /// One byte per element, 0 or 1.
    Bool,
    /// IEEE binary16, held as its bit pattern (`u16`).
    F16,
}

impl DType {
    pub const ALL: [DType; 5] = [DType::F32, DType::I64, DType::I32, DType::Bool, DType::F16];

    pub fn from_onnx(code: i32) -> Option<DType> {
        match code {
            1 => Some(DType::F32),
            7 => Some(DType::I64),
            6 => Some(DType::I32),
            9 => Some(DType::Bool),
            10 => Some(DType::F16),
            _ => None,
        }
    }

    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::I64 => 7,
            DType::I32 => 6,
            DType::Bool => 9,
            DType::F16 => 10,
        }
    }

    /// Bytes per element (also the alignment kiln gives it).
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::Bool => 1,
            DType::F16 => 2,
        }
    }

    /// The ONNX spelling, e.g. "float".
    pub fn name(self) -> &'static str {
        onnx_type_name(self.onnx_code())
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The ONNX spelling of a `TensorProto.DataType` code, for messages such as
/// "input 1 is float16".
pub fn onnx_type_name(code: i32) -> &'static str {
    match code {
        1 => "float",
        2 => "uint8",
        3 => "int8",
        4 => "uint16",
        5 => "int16",
        6 => "int32",
        7 => "int64",
        8 => "string",
        9 => "bool",
        10 => "float16",
        11 => "double",
        12 => "uint32",
        13 => "uint64",
        14 => "complex64",
        15 => "complex128",
        16 => "bfloat16",
        17..=20 => "float8",
        21 => "uint4",
        22 => "int4",
        _ => "an unknown type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onnx_codes_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_onnx(t.onnx_code()), Some(t));
        }
        assert_eq!(DType::from_onnx(10), Some(DType::F16));
        assert_eq!(DType::F16.size(), 2);
        assert_eq!(DType::from_onnx(16), None);
        assert_eq!(DType::I64.to_string(), "int64");
        assert_eq!(onnx_type_name(10), "float16");
        assert_eq!(onnx_type_name(99), "an unknown type");
    }
}
