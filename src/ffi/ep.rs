//! `OrtEp`: one per session. The C struct is the first field of the
//! `#[repr(C)]` [`EpObj`]; trampolines recover it and call [`EpImpl`].

use std::ffi::{c_char, CStr, CString};
use std::sync::Arc;

use super::api::{ort, Api};
use super::compute::{new_compute_info, release_compute_info, ComputeImpl};
use super::graph::{Graph, Node};
use super::logger::Logger;
use super::status::{check, guard, guard_or, Poison};
use super::{non_null, non_null_mut, slice, sys};
use crate::error::{Error, Result};

/// Where GetCapability records what kiln claims.
pub struct SupportInfo(*mut sys::OrtEpGraphSupportInfo);

impl SupportInfo {
    /// Claims `nodes` as one fused partition. With `drop_constant_initializers`
    /// ORT does not pass constant initializers as inputs: kiln copies them in Compile.
    pub fn add_fused(&mut self, nodes: &[Node<'_>], drop_constant_initializers: bool) -> Result<()> {
        let ptrs: Vec<*const sys::OrtNode> = nodes.iter().map(Node::as_ptr).collect();
        let options = sys::OrtNodeFusionOptions {
            ort_version_supported: 23,
            drop_constant_initializers,
        };
        // SAFETY: live support info; nodes belong to the graph of this call.
        unsafe {
            check(ort!(
                Api::get().ep,
                EpGraphSupportInfo_AddNodesToFuse(self.0, ptrs.as_ptr(), ptrs.len(), &options)
            ))
        }
    }
}

/// An attribute value of an EPContext node kiln creates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttrValue {
    Int(i64),
    /// A STRING attribute; ORT keeps the bytes as they are (binary-safe).
    Bytes(Vec<u8>),
}

/// An `EPContext` node (domain `com.microsoft`) for ORT to write into the
/// compiled model in place of a fused partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpContextNode {
    /// Op type and domain (`EPContext`, `com.microsoft`; the schema is the EP's).
    pub op_type: &'static str,
    pub domain: &'static str,
    /// Must be the fused node's name: ORT splices the node in by it.
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: Vec<(&'static str, AttrValue)>,
}

/// One fused partition ORT asks kiln to compile.
#[derive(Clone, Copy)]
pub struct Partition<'a> {
    pub graph: Graph<'a>,
    pub fused_node: Node<'a>,
}

/// What Compile produces for one partition.
pub struct Compiled {
    pub compute: Box<dyn ComputeImpl>,
    pub ep_context: Option<EpContextNode>,
}

/// What a compiling plugin EP must provide; kiln's is `ep::KilnEp`.
pub trait EpImpl: Send + Sync + 'static {
    fn name(&self) -> &CStr;
    fn logger(&self) -> Logger;
    fn get_capability(&self, graph: Graph<'_>, support: &mut SupportInfo) -> Result<()>;
    /// Compiles every partition of one Compile call (all of a model's
    /// partitions at once), in order.
    fn compile(&self, partitions: &[Partition<'_>]) -> Result<Vec<Compiled>>;
    /// What ORT records as `ep_compatibility_info.<EP>` in a compiled model.
    fn compatibility_info(&self) -> Option<&CStr>;
    /// Whether ORT may run several `Run`s of one session at once.
    fn concurrent_runs_supported(&self) -> bool;
    /// ORT finished creating the session (and wrote its EPContext model, if
    /// any): drop what only compiling needed.
    fn on_session_initialization_end(&self) -> Result<()>;
}

/// The API version whose `OrtEp` layout kiln declares and fills: every
/// member up to fn# 24 is implemented or a deliberate NULL.
pub const EP_VERSION: u32 = 31;

/// Zeroed pointer slots after the declared members (see factory.rs).
const RESERVED_TAIL: usize = 16;

#[repr(C)]
struct EpObj<T: EpImpl> {
    base: sys::OrtEp,
    _reserved: [usize; RESERVED_TAIL],
    imp: T,
    poison: Arc<Poison>,
}

/// Boxes `imp` behind an `OrtEp`.
pub fn new_ep<T: EpImpl>(imp: T) -> *mut sys::OrtEp {
    // SAFETY: all-zero is a valid OrtEp (every slot None).
    let mut base: sys::OrtEp = unsafe { std::mem::zeroed() };
    base.ort_version_supported = EP_VERSION;
    base.GetName = Some(get_name::<T>);
    base.GetCapability = Some(get_capability::<T>);
    base.Compile = Some(compile::<T>);
    base.ReleaseNodeComputeInfos = Some(release_node_compute_infos);
    base.GetCompiledModelCompatibilityInfo = Some(compatibility_info::<T>);
    base.IsConcurrentRunSupported = Some(is_concurrent_run_supported::<T>);
    base.OnSessionInitializationEnd = Some(on_session_initialization_end::<T>);
    // NULL, each accepted by ORT 1.31.1 (tests in ffi-tests/abi_members.rs):
    // data layout (NCHW is kiln's), dynamic options, run start/end hooks,
    // allocators and streams (kiln uses ORT's CPU memory), kernel registry
    // (kiln compiles, it registers no kernels), Sync (nothing asynchronous),
    // CreateProfiler (see README "ABI"), graph capture and replay, available
    // resources, default memory device (CPU) and weightless EPContext models.
    Box::into_raw(Box::new(EpObj {
        base,
        _reserved: [0; RESERVED_TAIL],
        imp,
        poison: Arc::default(),
    }))
    .cast()
}

/// # Safety
/// `ep` must be NULL or come from `new_ep::<T>` and not be used afterwards.
pub unsafe fn release_ep<T: EpImpl>(ep: *mut sys::OrtEp) -> Result<()> {
    let ep = non_null_mut(ep, "OrtEp")?;
    // SAFETY: per contract.
    drop(unsafe { Box::from_raw(ep.cast::<EpObj<T>>()) });
    Ok(())
}

/// # Safety
/// `this` must come from `new_ep::<T>`.
unsafe fn obj<'a, T: EpImpl>(this: *const sys::OrtEp) -> Result<&'a EpObj<T>> {
    let p = non_null(this, "OrtEp")?;
    // SAFETY: the base struct is the first field of the repr(C) EpObj.
    Ok(unsafe { &*p.cast::<EpObj<T>>() })
}

unsafe extern "C" fn get_name<T: EpImpl>(this: *const sys::OrtEp) -> *const c_char {
    // SAFETY: `this` is our EpObj; the name lives as long as the EP.
    guard_or("OrtEp::GetName", None, std::ptr::null(), || unsafe {
        Ok(obj::<T>(this)?.imp.name().as_ptr())
    })
}

unsafe extern "C" fn get_capability<T: EpImpl>(
    this: *mut sys::OrtEp,
    graph: *const sys::OrtGraph,
    support: *mut sys::OrtEpGraphSupportInfo,
) -> *mut sys::OrtStatus {
    // SAFETY: pointers from ORT, valid for this call.
    let Ok(ep) = (unsafe { obj::<T>(this) }) else {
        return guard("GetCapability", None, || Err(Error::invalid_argument("OrtEp is NULL")));
    };
    guard("GetCapability", Some(&ep.poison), || {
        let graph = unsafe { Graph::from_raw(graph)? };
        let mut support = SupportInfo(non_null_mut(support, "graph_support_info")?);
        let result = ep.imp.get_capability(graph, &mut support);
        // ORT only logs GetCapability errors; say it in kiln's words too.
        if let Err(e) = &result {
            ep.imp
                .logger()
                .error(&format!("GetCapability failed, kiln claims nothing: {e}"));
        }
        result
    })
}

unsafe extern "C" fn compile<T: EpImpl>(
    this: *mut sys::OrtEp,
    graphs: *mut *const sys::OrtGraph,
    fused_nodes: *mut *const sys::OrtNode,
    count: usize,
    node_compute_infos: *mut *mut sys::OrtNodeComputeInfo,
    ep_context_nodes: *mut *mut sys::OrtNode,
) -> *mut sys::OrtStatus {
    // SAFETY: arrays from ORT hold `count` entries, valid for this call.
    let Ok(ep) = (unsafe { obj::<T>(this) }) else {
        return guard("Compile", None, || Err(Error::invalid_argument("OrtEp is NULL")));
    };
    guard("Compile", Some(&ep.poison), || {
        let graphs = unsafe { slice(graphs.cast_const(), count, "graphs")? };
        let fused = unsafe { slice(fused_nodes.cast_const(), count, "fused_nodes")? };
        let infos_out = non_null_mut(node_compute_infos, "node_compute_infos")?;
        let mut partitions = Vec::with_capacity(count);
        for (&g, &n) in graphs.iter().zip(fused) {
            let (graph, fused_node) = unsafe { (Graph::from_raw(g)?, Node::from_raw(n)?) };
            partitions.push(Partition { graph, fused_node });
        }
        let compiled = ep.imp.compile(&partitions)?;
        if compiled.len() != count {
            return Err(Error::fail(format!(
                "kiln compiled {} of {count} partitions",
                compiled.len()
            )));
        }
        let nodes = create_ep_context_nodes(&compiled)?;
        if nodes.iter().any(Option::is_some) && ep_context_nodes.is_null() {
            release_nodes(nodes);
            return Err(Error::invalid_argument("ORT gave no room for EPContext nodes"));
        }
        // Only hand ORT anything once everything succeeded: on error ORT
        // releases nothing of ours, and `compiled` drops here.
        for (i, (c, node)) in compiled.into_iter().zip(nodes).enumerate() {
            unsafe { *infos_out.add(i) = new_compute_info(c.compute, ep.poison.clone()) };
            if let Some(node) = node {
                // ORT owns the node from here on.
                unsafe { *ep_context_nodes.add(i) = node };
            }
        }
        Ok(())
    })
}

/// Creates the EPContext nodes; on failure releases those already made.
fn create_ep_context_nodes(compiled: &[Compiled]) -> Result<Vec<Option<*mut sys::OrtNode>>> {
    let mut nodes = Vec::with_capacity(compiled.len());
    for c in compiled {
        match c.ep_context.as_ref().map(create_ep_context_node).transpose() {
            Ok(node) => nodes.push(node),
            Err(e) => {
                release_nodes(nodes);
                return Err(e);
            }
        }
    }
    Ok(nodes)
}

fn release_nodes(nodes: Vec<Option<*mut sys::OrtNode>>) {
    for node in nodes.into_iter().flatten() {
        // SAFETY: created by CreateNode and never handed to ORT.
        unsafe { ort!(Api::get().ort, ReleaseNode(node)) };
    }
}

/// Attributes kiln created; released on drop (CreateNode copies them).
struct OpAttrs(Vec<*mut sys::OrtOpAttr>);

impl Drop for OpAttrs {
    fn drop(&mut self) {
        for &a in &self.0 {
            // SAFETY: created by CreateOpAttr, released once.
            unsafe { ort!(Api::get().ort, ReleaseOpAttr(a)) };
        }
    }
}

fn create_attr(name: &str, value: &AttrValue) -> Result<*mut sys::OrtOpAttr> {
    let cname = CString::new(name).map_err(|_| Error::invalid_argument("attribute name holds NUL"))?;
    let mut attr = std::ptr::null_mut();
    let api = Api::get();
    // SAFETY: `data` points to `len` items of the declared type; ORT copies them.
    unsafe {
        match value {
            AttrValue::Int(v) => check(ort!(
                api.ort,
                CreateOpAttr(
                    cname.as_ptr(),
                    (v as *const i64).cast(),
                    1,
                    sys::ORT_OP_ATTR_INT,
                    &mut attr
                )
            ))?,
            AttrValue::Bytes(b) => {
                let len = i32::try_from(b.len()).map_err(|_| {
                    Error::invalid_argument(format!(
                        "attribute '{name}' would hold {} bytes, more than ONNX attributes allow; \
                         use ep.context_embed_mode=0",
                        b.len()
                    ))
                })?;
                check(ort!(
                    api.ort,
                    CreateOpAttr(
                        cname.as_ptr(),
                        b.as_ptr().cast(),
                        len,
                        sys::ORT_OP_ATTR_STRING,
                        &mut attr
                    )
                ))?
            }
        }
    }
    Ok(attr)
}

fn create_ep_context_node(spec: &EpContextNode) -> Result<*mut sys::OrtNode> {
    let mut attrs = OpAttrs(Vec::with_capacity(spec.attributes.len()));
    for (name, value) in &spec.attributes {
        attrs.0.push(create_attr(name, value)?);
    }
    let cstrings = |v: &[String]| -> Result<Vec<CString>> {
        v.iter()
            .map(|s| CString::new(s.as_str()).map_err(|_| Error::invalid_argument("name holds NUL")))
            .collect()
    };
    let (inputs, outputs) = (cstrings(&spec.inputs)?, cstrings(&spec.outputs)?);
    let input_ptrs: Vec<_> = inputs.iter().map(|s| s.as_ptr()).collect();
    let output_ptrs: Vec<_> = outputs.iter().map(|s| s.as_ptr()).collect();
    let name = CString::new(spec.name.as_str()).map_err(|_| Error::invalid_argument("node name holds NUL"))?;
    let op_type = CString::new(spec.op_type).map_err(|_| Error::invalid_argument("op type holds NUL"))?;
    let domain = CString::new(spec.domain).map_err(|_| Error::invalid_argument("domain holds NUL"))?;
    let mut node = std::ptr::null_mut();
    // SAFETY: GetModelEditorApi returns ORT's static table.
    let editor = unsafe { ort!(Api::get().ort, GetModelEditorApi()).as_ref() }
        .ok_or_else(|| Error::not_implemented("ORT has no model editor API"))?;
    // SAFETY: every pointer is valid for the call; CreateNode copies strings and attributes.
    unsafe {
        check(ort!(
            editor,
            CreateNode(
                op_type.as_ptr(),
                domain.as_ptr(),
                name.as_ptr(),
                input_ptrs.as_ptr(),
                input_ptrs.len(),
                output_ptrs.as_ptr(),
                output_ptrs.len(),
                attrs.0.as_mut_ptr(),
                attrs.0.len(),
                &mut node
            )
        ))?
    };
    Ok(node)
}

unsafe extern "C" fn compatibility_info<T: EpImpl>(
    this: *mut sys::OrtEp,
    _graph: *const sys::OrtGraph,
) -> *const c_char {
    // SAFETY: `this` is our EpObj; the string lives as long as the EP.
    guard_or("GetCompiledModelCompatibilityInfo", None, std::ptr::null(), || unsafe {
        Ok(obj::<T>(this)?
            .imp
            .compatibility_info()
            .map_or(std::ptr::null(), CStr::as_ptr))
    })
}

unsafe extern "C" fn is_concurrent_run_supported<T: EpImpl>(
    this: *mut sys::OrtEp,
    is_supported: *mut bool,
) -> *mut sys::OrtStatus {
    // SAFETY: `this` is our EpObj; `is_supported` ORT's out-pointer.
    let Ok(ep) = (unsafe { obj::<T>(this) }) else {
        return guard("IsConcurrentRunSupported", None, || {
            Err(Error::invalid_argument("OrtEp is NULL"))
        });
    };
    guard("IsConcurrentRunSupported", Some(&ep.poison), || {
        let out = non_null_mut(is_supported, "is_supported")?;
        crate::stats::concurrency_queried();
        unsafe { *out = ep.imp.concurrent_runs_supported() };
        Ok(())
    })
}

unsafe extern "C" fn on_session_initialization_end<T: EpImpl>(this: *mut sys::OrtEp) -> *mut sys::OrtStatus {
    // SAFETY: `this` is our EpObj.
    let Ok(ep) = (unsafe { obj::<T>(this) }) else {
        return guard("OnSessionInitializationEnd", None, || {
            Err(Error::invalid_argument("OrtEp is NULL"))
        });
    };
    guard("OnSessionInitializationEnd", Some(&ep.poison), || {
        ep.imp.on_session_initialization_end()
    })
}

unsafe extern "C" fn release_node_compute_infos(
    _this: *mut sys::OrtEp,
    infos: *mut *mut sys::OrtNodeComputeInfo,
    count: usize,
) {
    guard_or("ReleaseNodeComputeInfos", None, (), || {
        // SAFETY: ORT passes back the infos kiln wrote in Compile.
        let infos = unsafe { slice(infos.cast_const(), count, "node_compute_infos")? };
        for &info in infos {
            unsafe { release_compute_info(info)? };
        }
        Ok(())
    })
}
