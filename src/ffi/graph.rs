//! Read-only views of the graph ORT lends kiln in GetCapability and Compile
//! (`OrtGraph`, `OrtNode`, `OrtValueInfo`). They borrow ORT's objects for
//! `'a`, the duration of the callback: nothing here may be kept past it
//! (initializer data in particular is freed after Compile, so it is copied).

use std::ffi::c_char;
use std::marker::PhantomData;

use super::api::{ort, Api};
use super::status::check;
use super::tensor::{copy_tensor, read_tensor_info, TensorBytes, TensorInfo};
use super::{cstr_to_string, sys};
use crate::error::{Error, Result};

#[derive(Clone, Copy)]
pub struct Graph<'a>(*const sys::OrtGraph, PhantomData<&'a ()>);
#[derive(Clone, Copy)]
pub struct Node<'a>(*const sys::OrtNode, PhantomData<&'a ()>);
#[derive(Clone, Copy)]
pub struct ValueInfo<'a>(*const sys::OrtValueInfo, PhantomData<&'a ()>);

/// ORT's "ask the count, then fill an array of that size" pattern.
fn fetch<T>(
    count: impl FnOnce(&mut usize) -> *mut sys::OrtStatus,
    fill: impl FnOnce(*mut *const T, usize) -> *mut sys::OrtStatus,
) -> Result<Vec<*const T>> {
    let mut n = 0usize;
    // SAFETY: statuses come from ORT.
    unsafe { check(count(&mut n))? };
    let mut out = vec![std::ptr::null(); n];
    if n > 0 {
        // SAFETY: the buffer holds exactly n elements, as ORT requires.
        unsafe { check(fill(out.as_mut_ptr(), n))? };
    }
    Ok(out)
}

fn get_str(call: impl FnOnce(&mut *const c_char) -> *mut sys::OrtStatus) -> Result<String> {
    let mut p = std::ptr::null();
    // SAFETY: ORT returns a string borrowed from the object, copied at once.
    unsafe {
        check(call(&mut p))?;
        Ok(cstr_to_string(p))
    }
}

impl<'a> Graph<'a> {
    /// # Safety
    /// `p` must be a live `OrtGraph` for `'a`.
    pub unsafe fn from_raw(p: *const sys::OrtGraph) -> Result<Graph<'a>> {
        Ok(Graph(super::non_null(p, "OrtGraph")?, PhantomData))
    }

    pub fn name(&self) -> Result<String> {
        let api = Api::get();
        get_str(|out| unsafe { ort!(api.ort, Graph_GetName(self.0, out)) })
    }

    pub fn nodes(&self) -> Result<Vec<Node<'a>>> {
        let api = Api::get();
        let raw = fetch(
            |n| unsafe { ort!(api.ort, Graph_GetNumNodes(self.0, n)) },
            |buf, n| unsafe { ort!(api.ort, Graph_GetNodes(self.0, buf, n)) },
        )?;
        Ok(raw.into_iter().map(|p| Node(p, PhantomData)).collect())
    }

    /// The model's path as ORT was given it; `None` for a model loaded from
    /// bytes (ORT reports ""). A relative path is relative to the process's
    /// working directory.
    pub fn model_path(&self) -> Result<Option<std::path::PathBuf>> {
        let api = Api::get();
        let path = get_str(|out| unsafe { ort!(api.ort, Graph_GetModelPath(self.0, out)) })?;
        Ok((!path.is_empty()).then(|| std::path::PathBuf::from(path)))
    }

    /// Whether this graph is the body of a control-flow node (`If`, `Loop`,
    /// `Scan`) rather than the model's main graph.
    pub fn is_subgraph(&self) -> Result<bool> {
        let api = Api::get();
        let mut parent = std::ptr::null();
        // SAFETY: live graph, valid out-pointer; the node is only compared with null.
        unsafe { check(ort!(api.ort, Graph_GetParentNode(self.0, &mut parent)))? };
        Ok(!parent.is_null())
    }

    pub fn initializers(&self) -> Result<Vec<ValueInfo<'a>>> {
        let api = Api::get();
        let raw = fetch(
            |n| unsafe { ort!(api.ort, Graph_GetNumInitializers(self.0, n)) },
            |buf, n| unsafe { ort!(api.ort, Graph_GetInitializers(self.0, buf, n)) },
        )?;
        Ok(values(raw))
    }
}

fn values<'a>(raw: Vec<*const sys::OrtValueInfo>) -> Vec<ValueInfo<'a>> {
    raw.into_iter().map(|p| ValueInfo(p, PhantomData)).collect()
}

/// Missing optional inputs/outputs arrive as NULL entries.
fn optional_values<'a>(raw: Vec<*const sys::OrtValueInfo>) -> Vec<Option<ValueInfo<'a>>> {
    raw.into_iter()
        .map(|p| (!p.is_null()).then_some(ValueInfo(p, PhantomData)))
        .collect()
}

impl<'a> Node<'a> {
    /// # Safety
    /// `p` must be a live `OrtNode` for `'a`.
    pub unsafe fn from_raw(p: *const sys::OrtNode) -> Result<Node<'a>> {
        Ok(Node(super::non_null(p, "OrtNode")?, PhantomData))
    }

    pub fn as_ptr(&self) -> *const sys::OrtNode {
        self.0
    }

    pub fn id(&self) -> Result<usize> {
        let api = Api::get();
        let mut id = 0usize;
        // SAFETY: live node, valid out-pointer.
        unsafe { check(ort!(api.ort, Node_GetId(self.0, &mut id)))? };
        Ok(id)
    }

    pub fn name(&self) -> Result<String> {
        let api = Api::get();
        get_str(|out| unsafe { ort!(api.ort, Node_GetName(self.0, out)) })
    }

    pub fn op_type(&self) -> Result<String> {
        let api = Api::get();
        get_str(|out| unsafe { ort!(api.ort, Node_GetOperatorType(self.0, out)) })
    }

    pub fn domain(&self) -> Result<String> {
        let api = Api::get();
        get_str(|out| unsafe { ort!(api.ort, Node_GetDomain(self.0, out)) })
    }

    pub fn inputs(&self) -> Result<Vec<Option<ValueInfo<'a>>>> {
        let api = Api::get();
        let raw = fetch(
            |n| unsafe { ort!(api.ort, Node_GetNumInputs(self.0, n)) },
            |buf, n| unsafe { ort!(api.ort, Node_GetInputs(self.0, buf, n)) },
        )?;
        Ok(optional_values(raw))
    }

    /// Outer-scope values the node's subgraphs (an `If`/`Loop`/`Scan` body)
    /// read: dependencies as real as its inputs when grouping nodes.
    pub fn implicit_inputs(&self) -> Result<Vec<ValueInfo<'a>>> {
        let api = Api::get();
        // SAFETY: a live node; `fetch` passes a valid count pointer, then a
        // buffer of exactly that many elements.
        let raw = fetch(
            |n| unsafe { ort!(api.ort, Node_GetNumImplicitInputs(self.0, n)) },
            |buf, n| unsafe { ort!(api.ort, Node_GetImplicitInputs(self.0, buf, n)) },
        )?;
        Ok(optional_values(raw).into_iter().flatten().collect())
    }

    pub fn outputs(&self) -> Result<Vec<Option<ValueInfo<'a>>>> {
        let api = Api::get();
        let raw = fetch(
            |n| unsafe { ort!(api.ort, Node_GetNumOutputs(self.0, n)) },
            |buf, n| unsafe { ort!(api.ort, Node_GetOutputs(self.0, buf, n)) },
        )?;
        Ok(optional_values(raw))
    }

    /// The opset version of the op's schema this node uses.
    pub fn since_version(&self) -> Result<i32> {
        let mut v = 0i32;
        // SAFETY: live node, valid out-pointer.
        unsafe { check(ort!(Api::get().ort, Node_GetSinceVersion(self.0, &mut v)))? };
        Ok(v)
    }

    /// Every attribute of the node.
    pub fn attributes(&self) -> Result<Vec<Attribute<'a>>> {
        let api = Api::get();
        let raw = fetch(
            |n| unsafe { ort!(api.ort, Node_GetNumAttributes(self.0, n)) },
            |buf, n| unsafe { ort!(api.ort, Node_GetAttributes(self.0, buf, n)) },
        )?;
        Ok(raw.into_iter().map(|p| Attribute(p, PhantomData)).collect())
    }

    /// The attribute `name`, or `None` when the node lacks it.
    pub fn attribute(&self, name: &str) -> Result<Option<Attribute<'a>>> {
        let api = Api::get();
        let cname = std::ffi::CString::new(name).map_err(|_| Error::invalid_argument("attribute name holds NUL"))?;
        let mut attr = std::ptr::null();
        // SAFETY: live node; the attribute is borrowed from it.
        let status = unsafe { ort!(api.ort, Node_GetAttributeByName(self.0, cname.as_ptr(), &mut attr)) };
        // SAFETY: status from ORT. ORT_NOT_FOUND means "no such attribute".
        match unsafe { check(status) } {
            Ok(()) if !attr.is_null() => Ok(Some(Attribute(attr, PhantomData))),
            Ok(()) => Ok(None),
            Err(e) if e.kind == crate::error::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A short label for messages: `name (op_type)`.
    pub fn label(&self) -> String {
        let name = self.name().unwrap_or_default();
        let op = self.op_type().unwrap_or_default();
        format!("'{name}' ({op})")
    }
}

/// A node attribute, borrowed from its node.
#[derive(Clone, Copy)]
pub struct Attribute<'a>(*const sys::OrtOpAttr, PhantomData<&'a ()>);

/// An attribute's value, copied out of ORT.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrRead {
    Int(i64),
    Ints(Vec<i64>),
    Float(f32),
    Floats(Vec<f32>),
    String(Vec<u8>),
    Strings(Vec<Vec<u8>>),
    Tensor(TensorBytes),
    /// A kind kiln does not read (graphs, sparse tensors ...), by type code.
    Other(i32),
}

impl Attribute<'_> {
    pub fn name(&self) -> Result<String> {
        get_str(|out| unsafe { ort!(Api::get().ort, OpAttr_GetName(self.0, out)) })
    }

    /// The value, whatever its kind.
    pub fn value(&self) -> Result<AttrRead> {
        Ok(match self.kind()? {
            sys::ORT_OP_ATTR_INT => AttrRead::Int(self.int()?.unwrap_or_default()),
            sys::ORT_OP_ATTR_INTS => AttrRead::Ints(self.array::<i64>(sys::ORT_OP_ATTR_INTS)?),
            sys::ORT_OP_ATTR_FLOAT => AttrRead::Float(
                self.array::<f32>(sys::ORT_OP_ATTR_FLOAT)?
                    .first()
                    .copied()
                    .unwrap_or(0.0),
            ),
            sys::ORT_OP_ATTR_FLOATS => AttrRead::Floats(self.array::<f32>(sys::ORT_OP_ATTR_FLOATS)?),
            sys::ORT_OP_ATTR_STRING => AttrRead::String(self.bytes()?.unwrap_or_default()),
            sys::ORT_OP_ATTR_STRINGS => AttrRead::Strings(self.strings()?),
            sys::ORT_OP_ATTR_TENSOR => AttrRead::Tensor(self.tensor()?),
            other => AttrRead::Other(other as i32),
        })
    }

    /// Reads a numeric attribute into a Vec: ask the byte size, then fill.
    fn array<T: Copy + Default>(&self, kind: sys::OrtOpAttrType) -> Result<Vec<T>> {
        let api = Api::get();
        let mut needed = 0usize;
        // SAFETY: a size query with a NULL buffer; its "too small" status is expected.
        let status = unsafe { ort!(api.ort, ReadOpAttr(self.0, kind, std::ptr::null_mut(), 0, &mut needed)) };
        // SAFETY: status from ORT.
        let _ = unsafe { check(status) };
        let mut out = vec![T::default(); needed / std::mem::size_of::<T>()];
        if out.is_empty() {
            return Ok(out);
        }
        let mut written = 0usize;
        let bytes = out.len() * std::mem::size_of::<T>();
        // SAFETY: the buffer holds `bytes` bytes of T.
        unsafe {
            check(ort!(
                api.ort,
                ReadOpAttr(self.0, kind, out.as_mut_ptr().cast(), bytes, &mut written)
            ))?
        };
        out.truncate(written / std::mem::size_of::<T>());
        Ok(out)
    }

    /// STRINGS: ORT fills one buffer of NUL-terminated strings.
    fn strings(&self) -> Result<Vec<Vec<u8>>> {
        let raw = self.array::<u8>(sys::ORT_OP_ATTR_STRINGS)?;
        let mut parts: Vec<Vec<u8>> = raw.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
        if raw.last() == Some(&0) {
            parts.pop();
        }
        Ok(parts)
    }

    fn tensor(&self) -> Result<TensorBytes> {
        let api = Api::get();
        let mut value = std::ptr::null_mut();
        // SAFETY: a TENSOR attribute; ORT hands us a new OrtValue.
        unsafe { check(ort!(api.ort, OpAttr_GetTensorAttributeAsOrtValue(self.0, &mut value)))? };
        // SAFETY: the value is ours; copy, then release it once.
        let result = unsafe { copy_tensor(value) };
        // SAFETY: as above.
        unsafe { ort!(api.ort, ReleaseValue(value)) };
        result
    }

    fn kind(&self) -> Result<sys::OrtOpAttrType> {
        let mut t = sys::ORT_OP_ATTR_UNDEFINED;
        // SAFETY: live attribute, valid out-pointer.
        unsafe { check(ort!(Api::get().ort, OpAttr_GetType(self.0, &mut t)))? };
        Ok(t)
    }

    /// An INT attribute's value; `None` for another type.
    pub fn int(&self) -> Result<Option<i64>> {
        if self.kind()? != sys::ORT_OP_ATTR_INT {
            return Ok(None);
        }
        let (mut v, mut written) = (0i64, 0usize);
        let size = std::mem::size_of::<i64>();
        // SAFETY: the buffer holds one i64.
        unsafe {
            check(ort!(
                Api::get().ort,
                ReadOpAttr(
                    self.0,
                    sys::ORT_OP_ATTR_INT,
                    (&mut v as *mut i64).cast(),
                    size,
                    &mut written
                )
            ))?
        };
        Ok(Some(v))
    }

    /// A STRING attribute's bytes copied once into 64-byte-aligned memory, so
    /// weights inside them can be used in place; `None` for another type.
    pub fn aligned_bytes(&self) -> Result<Option<crate::plan::AlignedBytes>> {
        if self.kind()? != sys::ORT_OP_ATTR_STRING {
            return Ok(None);
        }
        let needed = self.string_len()?;
        let mut buf = crate::plan::AlignedBytes::zeroed(needed);
        if needed > 0 {
            self.read_string(buf.bytes_mut())?;
        }
        Ok(Some(buf))
    }

    fn string_len(&self) -> Result<usize> {
        let mut needed = 0usize;
        // SAFETY: a size query (NULL buffer) reports the byte count; ORT answers
        // it with an INVALID_ARGUMENT status, which is expected here.
        let status = unsafe {
            ort!(
                Api::get().ort,
                ReadOpAttr(self.0, sys::ORT_OP_ATTR_STRING, std::ptr::null_mut(), 0, &mut needed)
            )
        };
        // SAFETY: status from ORT.
        let _ = unsafe { check(status) };
        Ok(needed)
    }

    fn read_string(&self, buf: &mut [u8]) -> Result<usize> {
        let mut written = 0usize;
        // SAFETY: the buffer holds buf.len() bytes.
        unsafe {
            check(ort!(
                Api::get().ort,
                ReadOpAttr(
                    self.0,
                    sys::ORT_OP_ATTR_STRING,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut written
                )
            ))?
        };
        Ok(written)
    }

    /// A STRING attribute's bytes (binary-safe); `None` for another type.
    pub fn bytes(&self) -> Result<Option<Vec<u8>>> {
        if self.kind()? != sys::ORT_OP_ATTR_STRING {
            return Ok(None);
        }
        let mut buf = vec![0u8; self.string_len()?];
        if !buf.is_empty() {
            let written = self.read_string(&mut buf)?;
            buf.truncate(written);
        }
        Ok(Some(buf))
    }
}

impl<'a> ValueInfo<'a> {
    pub fn name(&self) -> Result<String> {
        let api = Api::get();
        get_str(|out| unsafe { ort!(api.ort, GetValueInfoName(self.0, out)) })
    }

    /// The tensor type, or `None` for a non-tensor or untyped value.
    pub fn tensor_info(&self) -> Result<Option<TensorInfo>> {
        let api = Api::get();
        let mut type_info = std::ptr::null();
        // SAFETY: borrowed type info, valid while the value info lives.
        unsafe { check(ort!(api.ort, GetValueInfoTypeInfo(self.0, &mut type_info)))? };
        if type_info.is_null() {
            return Ok(None);
        }
        let mut onnx_type = sys::ONNX_TYPE_UNKNOWN;
        // SAFETY: live type info.
        unsafe { check(ort!(api.ort, GetOnnxTypeFromTypeInfo(type_info, &mut onnx_type)))? };
        if onnx_type != sys::ONNX_TYPE_TENSOR {
            return Ok(None);
        }
        let mut tensor = std::ptr::null();
        // SAFETY: a tensor type info; the cast result is borrowed from it.
        unsafe { check(ort!(api.ort, CastTypeInfoToTensorInfo(type_info, &mut tensor)))? };
        // SAFETY: `tensor` is a live shape info borrowed from `type_info`.
        unsafe { read_tensor_info(tensor) }.map(Some)
    }

    /// The node producing this value inside the current graph, if any.
    pub fn producer(&self) -> Result<Option<Node<'a>>> {
        let api = Api::get();
        let (mut node, mut index) = (std::ptr::null(), 0usize);
        // SAFETY: live value info, valid out-pointers.
        unsafe { check(ort!(api.ort, ValueInfo_GetValueProducer(self.0, &mut node, &mut index)))? };
        Ok((!node.is_null()).then_some(Node(node, PhantomData)))
    }

    pub fn is_constant_initializer(&self) -> Result<bool> {
        let api = Api::get();
        let mut yes = false;
        // SAFETY: live value info, valid out-pointer.
        unsafe { check(ort!(api.ort, ValueInfo_IsConstantInitializer(self.0, &mut yes)))? };
        Ok(yes)
    }

    /// Copies a constant initializer of any element type (ORT frees its copy
    /// after Compile); `None` when the value has no initializer.
    pub fn copy_initializer(&self) -> Result<Option<TensorBytes>> {
        let mut value = std::ptr::null();
        // SAFETY: borrowed OrtValue, valid during the callback.
        unsafe { check(ort!(Api::get().ort, ValueInfo_GetInitializerValue(self.0, &mut value)))? };
        if value.is_null() {
            return Ok(None);
        }
        // SAFETY: a live tensor value borrowed from the graph.
        unsafe { copy_tensor(value) }.map(Some)
    }
}
