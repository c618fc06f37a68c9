//! Host tensors: constant values while importing and folding.

use super::{DType, ShapeDisplay, TensorType};
use crate::error::{Error, Result};
use crate::kernels::half::{f16_to_f32, f32_to_f16};
use crate::plan::Weight;

#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    /// 0 or 1 per element.
    Bool(Vec<u8>),
    /// float16 bit patterns.
    F16(Vec<u16>),
}

/// A tensor held in memory, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl Tensor {
    pub fn f32(shape: &[usize], data: Vec<f32>) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: TensorData::F32(data),
        }
    }

    pub fn i64(shape: &[usize], data: Vec<i64>) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: TensorData::I64(data),
        }
    }

    pub fn bool(shape: &[usize], data: Vec<u8>) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: TensorData::Bool(data),
        }
    }

    /// A tensor of `ty` with every element `value` (converted to the dtype).
    pub fn filled(ty: &TensorType, value: f64) -> Tensor {
        let n = ty.numel();
        let data = match ty.dtype {
            DType::F32 => TensorData::F32(vec![value as f32; n]),
            DType::I64 => TensorData::I64(vec![value as i64; n]),
            DType::I32 => TensorData::I32(vec![value as i32; n]),
            DType::Bool => TensorData::Bool(vec![u8::from(value != 0.0); n]),
            // Through f32, as ORT's casts to float16 go.
            DType::F16 => TensorData::F16(vec![f32_to_f16(value as f32); n]),
        };
        Tensor {
            shape: ty.shape.clone(),
            data,
        }
    }

    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::F32(_) => DType::F32,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
            TensorData::Bool(_) => DType::Bool,
            TensorData::F16(_) => DType::F16,
        }
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype(), &self.shape)
    }

    pub fn numel(&self) -> usize {
        match &self.data {
            TensorData::F32(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::Bool(v) => v.len(),
            TensorData::F16(v) => v.len(),
        }
    }

    /// Little-endian bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.data {
            TensorData::F32(v) => bytemuck::cast_slice(v).to_vec(),
            TensorData::I64(v) => bytemuck::cast_slice(v).to_vec(),
            TensorData::I32(v) => bytemuck::cast_slice(v).to_vec(),
            TensorData::Bool(v) => v.clone(),
            TensorData::F16(v) => bytemuck::cast_slice(v).to_vec(),
        }
    }

    pub fn to_weight(&self) -> Weight {
        match &self.data {
            TensorData::F32(v) => Weight::from_vec(v.clone()),
            _ => Weight::from_bytes(&self.to_bytes()),
        }
    }

    /// Parses little-endian bytes of `dtype`; `Err` if the length is wrong.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        let ty = TensorType::new(dtype, shape);
        let n = ty
            .checked_numel()
            .ok_or_else(|| Error::invalid_graph(format!("tensor of type {ty} is too large")))?;
        if bytes.len() != n * dtype.size() {
            crate::bail!(
                InvalidGraph,
                "a {dtype} tensor of shape {} needs {} bytes, got {}",
                ShapeDisplay(shape),
                n * dtype.size(),
                bytes.len()
            );
        }
        let data = match dtype {
            DType::F32 => TensorData::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I64 => TensorData::I64(
                bytes
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I32 => TensorData::I32(
                bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::Bool => TensorData::Bool(bytes.iter().map(|&b| u8::from(b != 0)).collect()),
            DType::F16 => TensorData::F16(
                bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// Integer (or bool) contents as i64; `None` for f32 and float16.
    pub fn as_i64s(&self) -> Option<Vec<i64>> {
        match &self.data {
            TensorData::I64(v) => Some(v.clone()),
            TensorData::I32(v) => Some(v.iter().map(|&x| x as i64).collect()),
            TensorData::Bool(v) => Some(v.iter().map(|&x| x as i64).collect()),
            TensorData::F32(_) | TensorData::F16(_) => None,
        }
    }

    /// Contents as f64, whatever the dtype.
    pub fn as_f64s(&self) -> Vec<f64> {
        match &self.data {
            TensorData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::F16(v) => v.iter().map(|&x| f16_to_f32(x) as f64).collect(),
        }
    }

    /// The value of a one-element tensor, as f64.
    pub fn scalar(&self) -> Option<f64> {
        (self.numel() == 1).then(|| self.as_f64s()[0])
    }

    /// Whether every element equals `v` (as f64) within `tol` relative.
    pub fn all_close_to(&self, v: f64, tol: f64) -> bool {
        self.numel() > 0
            && self
                .as_f64s()
                .iter()
                .all(|&x| (x - v).abs() <= tol * v.abs().max(1e-30))
    }
}
