//! The compiler: IR graph in, [`Program`] out, as a pipeline of passes
//! (see `docs/compiler.md`):
//!
//! 1. `Graph::validate` — refuse anything kiln cannot run, with a reason.
//! 2. [`fold`] — evaluate constant subgraphs (shape arithmetic, `Shape` of
//!    static shapes, constant transposes, ...).
//! 3. [`patterns`] — recognise decomposed GELU, LayerNorm and Softmax.
//! 4. [`layout`] — move transposes through layout-agnostic ops and cancel
//!    inverse pairs (the channels-last spatial ops' round trips).
//! 5. [`epilogue`] — fuse scale, bias, activation and residual into GEMMs;
//!    [`conv_fusion`] — per-channel scale/shift, activation and residual
//!    into convolutions; then (with `patterns`) [`attention`] — multi-head
//!    attention into one fused op, [`qkv`] — its Q, K and V projections
//!    into one product, and [`embed`] — embeddings + LayerNorm into one op.
//!    Last, [`chain`] — what is left of f32 elementwise ops, chains of them
//!    into one op that runs them in one pass.
//! 6. [`dce`] — drop nodes whose results reach no graph output.
//! 7. [`alias`] — layout-only ops become buffer aliases.
//! 8. [`lower`] — pick kernels and layouts, pack constant GEMM weights for
//!    the target, give every value a buffer (inputs/constants in place,
//!    outputs in the caller's buffers, intermediates in one arena laid out
//!    by [`memplan`]).

mod alias;
// Attention fusion (issue #14).
mod attention;
// Elementwise chains (issue #14).
mod chain;
// Convolution (issue #13).
mod conv_affine;
mod conv_fusion;
mod dce;
// Embeddings + LayerNorm (issue #14).
mod embed;
mod epilogue;
mod fold;
pub mod generic;
pub use fold::eval_op;
pub use generic::PackedWeights;
mod layout;
mod lower;
mod memplan;
mod patterns;
mod qkv;

use crate::error::Result;
use crate::ir::Graph;
use crate::plan::Program;
use crate::target::Target;

/// Imports a partition's description into the IR, folding with kiln's
/// kernels (see [`crate::ir::import`]).
pub fn import(graph: &crate::ir::GraphDesc, constants: &dyn crate::ir::ConstantSource) -> Result<Graph> {
    crate::ir::import(graph, constants, &fold::KernelFold)
}

/// [`crate::ir::check_support`], folding with kiln's kernels: the support
/// check GetCapability and Compile share.
pub fn check_support(
    graph: &crate::ir::GraphDesc,
    constants: &dyn crate::ir::ConstantSource,
    disabled: &[String],
) -> Vec<std::result::Result<(), String>> {
    crate::ir::check_support(graph, constants, disabled, &fold::KernelFold)
}

/// Which optional passes run (all by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Passes {
    pub fold: bool,
    pub patterns: bool,
    /// Channels-last layout propagation ([`layout`]).
    pub layout: bool,
    pub epilogue: bool,
    /// Elementwise chains into one op ([`chain`]).
    pub chain: bool,
    /// 3×3 convolutions as Winograd's where `kernels::winograd::pays` says
    /// so (the `winograd` option; off keeps the direct convolution's roundings).
    pub winograd: bool,
}

impl Default for Passes {
    fn default() -> Self {
        Passes {
            fold: true,
            patterns: true,
            layout: true,
            epilogue: true,
            chain: true,
            winograd: true,
        }
    }
}

/// Compiles `graph` for `target`. The target need not be this host's: a
/// program is only refused when it is run somewhere that cannot run it.
pub fn compile(graph: &Graph, target: Target) -> Result<Program> {
    compile_with(graph, target, Passes::default())
}

/// [`compile`] with a choice of optional passes.
pub fn compile_with(graph: &Graph, target: Target, passes: Passes) -> Result<Program> {
    compile_impl(graph, target, passes, None)
}

/// [`compile`] reusing GEMM weights packed beforehand (see [`generic`]),
/// with or without Winograd convolutions.
pub fn compile_with_packs(graph: &Graph, target: Target, packs: &PackedWeights, winograd: bool) -> Result<Program> {
    let passes = Passes {
        winograd,
        ..Passes::default()
    };
    compile_impl(graph, target, passes, Some(packs))
}

fn compile_impl(graph: &Graph, target: Target, passes: Passes, packs: Option<&PackedWeights>) -> Result<Program> {
    graph.validate()?;
    let ctx = |e: crate::error::Error| e.context(format_args!("graph '{}'", graph.name));
    let g = optimise(graph, passes).map_err(ctx)?;
    let folded = alias::fold_aliases(&g);
    lower::lower(&g, target, &folded, packs, passes.winograd).map_err(ctx)
}

/// The graph after the IR passes (before lowering).
pub fn optimise(graph: &Graph, passes: Passes) -> Result<Graph> {
    let mut g = graph.clone();
    // Shape always folds: lowering has no kernel for it.
    fold::fold_constants_where(&mut g, passes.fold)?;
    dce::remove_dead(&mut g);
    if passes.patterns {
        patterns::recognise(&mut g);
    }
    if passes.layout {
        layout::propagate(&mut g)?;
    }
    if passes.epilogue {
        epilogue::fuse(&mut g);
        conv_fusion::fuse(&mut g);
    }
    // After the epilogues, which fold the scores' scale into the product's alpha.
    if passes.patterns {
        attention::fuse(&mut g);
        // After the attention fusion, which names Q, K and V.
        qkv::fuse(&mut g);
        embed::fuse(&mut g);
    }
    // Last: the chains take only what the other fusions left.
    if passes.chain {
        chain::fuse(&mut g);
    }
    dce::remove_dead(&mut g);
    if cfg!(debug_assertions) {
        g.validate()
            .map_err(|e| lower::internal(format_args!("a pass broke the graph: {e}")))?;
    }
    Ok(g)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod generic_tests;

// Convolution (issue #13).
#[cfg(test)]
mod conv_tests;

// Attention fusion (issue #14).
#[cfg(test)]
mod attention_tests;

#[cfg(test)]
mod qkv_tests;

#[cfg(test)]
mod embed_tests;

#[cfg(test)]
mod chain_tests;
