//! `OrtEp`: one per session. The C struct is the first field of the
//! `#[repr(C)]` [`EpObj`]; trampolines recover it and call [`EpImpl`].

use std::ffi::{c_char, CStr};
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

/// What a compiling plugin EP must provide; kiln's is `ep::KilnEp`.
pub trait EpImpl: Send + Sync + 'static {
    fn name(&self) -> &CStr;
    fn logger(&self) -> Logger;
    fn get_capability(&self, graph: Graph<'_>, support: &mut SupportInfo) -> Result<()>;
    /// Compiles one fused partition into something ORT can run.
    fn compile(&self, graph: Graph<'_>, fused_node: Node<'_>) -> Result<Box<dyn ComputeImpl>>;
}

#[repr(C)]
struct EpObj<T: EpImpl> {
    base: sys::OrtEp,
    imp: T,
    poison: Arc<Poison>,
}

/// Boxes `imp` behind a v23 `OrtEp`.
pub fn new_ep<T: EpImpl>(imp: T) -> *mut sys::OrtEp {
    // SAFETY: all-zero is a valid OrtEp (every slot None).
    let mut base: sys::OrtEp = unsafe { std::mem::zeroed() };
    base.ort_version_supported = 23;
    base.GetName = Some(get_name::<T>);
    base.GetCapability = Some(get_capability::<T>);
    base.Compile = Some(compile::<T>);
    base.ReleaseNodeComputeInfos = Some(release_node_compute_infos);
    Box::into_raw(Box::new(EpObj {
        base,
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
    _ep_context_nodes: *mut *mut sys::OrtNode,
) -> *mut sys::OrtStatus {
    // SAFETY: arrays from ORT hold `count` entries, valid for this call.
    let Ok(ep) = (unsafe { obj::<T>(this) }) else {
        return guard("Compile", None, || Err(Error::invalid_argument("OrtEp is NULL")));
    };
    guard("Compile", Some(&ep.poison), || {
        let graphs = unsafe { slice(graphs.cast_const(), count, "graphs")? };
        let fused = unsafe { slice(fused_nodes.cast_const(), count, "fused_nodes")? };
        let out = non_null_mut(node_compute_infos, "node_compute_infos")?;
        let mut compiled = Vec::with_capacity(count);
        for (&g, &n) in graphs.iter().zip(fused) {
            let (graph, node) = unsafe { (Graph::from_raw(g)?, Node::from_raw(n)?) };
            compiled.push(ep.imp.compile(graph, node)?);
        }
        // Only hand ORT the infos once every partition compiled: on error
        // ORT releases none, and `compiled` drops here.
        for (i, c) in compiled.into_iter().enumerate() {
            unsafe { *out.add(i) = new_compute_info(c, ep.poison.clone()) };
        }
        Ok(())
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
