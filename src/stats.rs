//! Process-wide counters of what kiln did, readable from C, Python (ctypes)
//! and tests through the exported `kiln_ep_stats`: proof that kiln, not the
//! CPU EP, ran a model. Also, per thread, what the last GetCapability left to
//! other EPs and why (`kiln_ep_last_left_out`).

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of kiln's counters since the library was loaded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KilnStats {
    /// OrtEp instances created (one per session using kiln).
    pub eps_created: u64,
    /// Fused partitions compiled.
    pub partitions_compiled: u64,
    /// ONNX nodes inside those partitions.
    pub nodes_compiled: u64,
    /// Compute calls that ran a compiled partition.
    pub compute_calls: u64,
    /// Context binary files opened (and memory-mapped) to load EPContext nodes.
    pub context_files_opened: u64,
    /// Graphs loaded from EPContext nodes instead of being compiled.
    pub context_graphs_loaded: u64,
    /// Context binaries taken from the shared workspace instead of being opened.
    pub context_files_shared: u64,
    /// Bytes of context binary files written.
    pub context_bytes_written: u64,
    /// Weight bytes not written because an identical weight was already stored.
    pub context_bytes_deduplicated: u64,
    /// Steps split over ORT's intra-op thread pool (`KernelContext_ParallelFor`).
    pub parallel_for_calls: u64,
    /// OrtEp instances ORT released.
    pub eps_released: u64,
    /// `OnSessionInitializationEnd` calls (sessions ORT finished creating).
    pub sessions_initialized: u64,
    /// `IsConcurrentRunSupported` calls.
    pub concurrency_queries: u64,
    /// `GetHardwareDeviceIncompatibilityDetails` calls.
    pub device_queries: u64,
    /// Factories created (`CreateEpFactories`) and freed; a factory ORT
    /// releases while sessions still hold its EPs is freed with the last EP.
    pub factories_created: u64,
    pub factories_freed: u64,
    /// Programs built for a shape-generic partition at the first run with a
    /// new input shape signature (later runs at that shape reuse them).
    pub shapes_specialized: u64,
    /// Rendezvous run to learn whether a session's intra-op pool has threads
    /// besides the caller, and how many of them a pool thread joined.
    pub pool_rendezvous: u64,
    pub pool_rendezvous_joined: u64,
}

static EPS_CREATED: AtomicU64 = AtomicU64::new(0);
static PARTITIONS: AtomicU64 = AtomicU64::new(0);
static NODES: AtomicU64 = AtomicU64::new(0);
static COMPUTES: AtomicU64 = AtomicU64::new(0);
static FILES_OPENED: AtomicU64 = AtomicU64::new(0);
static GRAPHS_LOADED: AtomicU64 = AtomicU64::new(0);
static FILES_SHARED: AtomicU64 = AtomicU64::new(0);
static BYTES_WRITTEN: AtomicU64 = AtomicU64::new(0);
static BYTES_DEDUPLICATED: AtomicU64 = AtomicU64::new(0);
static PARALLEL_FOR: AtomicU64 = AtomicU64::new(0);
static EPS_RELEASED: AtomicU64 = AtomicU64::new(0);
static SESSIONS_INITIALIZED: AtomicU64 = AtomicU64::new(0);
static CONCURRENCY_QUERIES: AtomicU64 = AtomicU64::new(0);
static DEVICE_QUERIES: AtomicU64 = AtomicU64::new(0);
static FACTORIES_CREATED: AtomicU64 = AtomicU64::new(0);
static FACTORIES_FREED: AtomicU64 = AtomicU64::new(0);
static SHAPES_SPECIALIZED: AtomicU64 = AtomicU64::new(0);
static RENDEZVOUS: AtomicU64 = AtomicU64::new(0);
static RENDEZVOUS_JOINED: AtomicU64 = AtomicU64::new(0);

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub fn ep_released() {
    bump(&EPS_RELEASED);
}

pub fn session_initialized() {
    bump(&SESSIONS_INITIALIZED);
}

pub fn concurrency_queried() {
    bump(&CONCURRENCY_QUERIES);
}

pub fn device_queried() {
    bump(&DEVICE_QUERIES);
}

pub fn factory_created() {
    bump(&FACTORIES_CREATED);
}

pub fn factory_freed() {
    bump(&FACTORIES_FREED);
}

pub fn shape_specialized() {
    bump(&SHAPES_SPECIALIZED);
}

pub fn ep_created() {
    EPS_CREATED.fetch_add(1, Ordering::Relaxed);
}

pub fn partition_compiled(nodes: usize) {
    PARTITIONS.fetch_add(1, Ordering::Relaxed);
    NODES.fetch_add(nodes as u64, Ordering::Relaxed);
}

pub fn compute_called() {
    COMPUTES.fetch_add(1, Ordering::Relaxed);
}

pub fn context_file_opened() {
    FILES_OPENED.fetch_add(1, Ordering::Relaxed);
}

pub fn context_graph_loaded() {
    GRAPHS_LOADED.fetch_add(1, Ordering::Relaxed);
}

pub fn context_file_shared() {
    FILES_SHARED.fetch_add(1, Ordering::Relaxed);
}

pub fn context_written(bytes: u64, deduplicated: u64) {
    BYTES_WRITTEN.fetch_add(bytes, Ordering::Relaxed);
    BYTES_DEDUPLICATED.fetch_add(deduplicated, Ordering::Relaxed);
}

pub fn pool_rendezvous(joined: bool) {
    bump(&RENDEZVOUS);
    if joined {
        bump(&RENDEZVOUS_JOINED);
    }
}

pub fn parallel_for_called() {
    PARALLEL_FOR.fetch_add(1, Ordering::Relaxed);
}

pub fn snapshot() -> KilnStats {
    KilnStats {
        eps_created: EPS_CREATED.load(Ordering::Relaxed),
        partitions_compiled: PARTITIONS.load(Ordering::Relaxed),
        nodes_compiled: NODES.load(Ordering::Relaxed),
        compute_calls: COMPUTES.load(Ordering::Relaxed),
        context_files_opened: FILES_OPENED.load(Ordering::Relaxed),
        context_graphs_loaded: GRAPHS_LOADED.load(Ordering::Relaxed),
        context_files_shared: FILES_SHARED.load(Ordering::Relaxed),
        context_bytes_written: BYTES_WRITTEN.load(Ordering::Relaxed),
        context_bytes_deduplicated: BYTES_DEDUPLICATED.load(Ordering::Relaxed),
        parallel_for_calls: PARALLEL_FOR.load(Ordering::Relaxed),
        eps_released: EPS_RELEASED.load(Ordering::Relaxed),
        sessions_initialized: SESSIONS_INITIALIZED.load(Ordering::Relaxed),
        concurrency_queries: CONCURRENCY_QUERIES.load(Ordering::Relaxed),
        device_queries: DEVICE_QUERIES.load(Ordering::Relaxed),
        factories_created: FACTORIES_CREATED.load(Ordering::Relaxed),
        factories_freed: FACTORIES_FREED.load(Ordering::Relaxed),
        shapes_specialized: SHAPES_SPECIALIZED.load(Ordering::Relaxed),
        pool_rendezvous: RENDEZVOUS.load(Ordering::Relaxed),
        pool_rendezvous_joined: RENDEZVOUS_JOINED.load(Ordering::Relaxed),
    }
}

thread_local! {
    /// What the last GetCapability on this thread left to other EPs, summed
    /// up by op and reason (see [`set_left_out`]).
    static LEFT_OUT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Records GetCapability's summary of the nodes it left to other EPs
/// (`"3 x Conv: reason; 1 x Relu: reason"`, empty for none) for
/// [`left_out`]. Per thread: ORT runs GetCapability on the thread that
/// creates (or compiles) the session, so concurrent sessions on other
/// threads do not overwrite a caller's answer.
pub fn set_left_out(summary: String) {
    LEFT_OUT.with(|s| *s.borrow_mut() = summary);
}

/// The summary [`set_left_out`] last recorded on this thread.
pub fn left_out() -> String {
    LEFT_OUT.with(|s| s.borrow().clone())
}
