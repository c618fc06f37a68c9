//! Reading a context binary's header and metadata without the weights: what
//! a writer needs to decide whether an existing file is its to replace, and
//! what the shared-binary cache needs to tell two versions of a file apart.
//! Cheap for any file size; nothing here vouches for the weights (only
//! [`ContextBinary::parse`](super::ContextBinary::parse) checks the checksum).

use std::io::Read;

use prost::Message;

use super::header::{Header, HEADER_LEN};
use super::proto;
use crate::error::{Error, Result};

/// The longest metadata `peek` reads (the weights are elsewhere; real
/// metadata is kilobytes to a few megabytes).
const MAX_PEEK_METADATA: u64 = 256 << 20;

/// What a binary's header and metadata say about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peek {
    pub checksum: u128,
    pub kiln_version: String,
    /// The compiled models the binary was written for (empty: an older kiln wrote it).
    pub context_models: Vec<String>,
}

/// The header's checksum, from the first 64 bytes.
pub fn peek_checksum(file: &mut dyn Read) -> Result<u128> {
    Ok(read_header(file)?.checksum)
}

/// The header and metadata, read from the start of a context binary.
pub fn peek(file: &mut dyn Read) -> Result<Peek> {
    let header = read_header(file)?;
    if header.metadata_len > MAX_PEEK_METADATA {
        crate::bail!(
            InvalidGraph,
            "metadata of {} bytes is implausibly large",
            header.metadata_len
        );
    }
    let mut metadata = vec![0u8; header.metadata_len as usize];
    file.read_exact(&mut metadata)
        .map_err(|e| Error::invalid_graph(format!("reading the metadata: {e}")))?;
    let meta = proto::Metadata::decode(metadata.as_slice())
        .map_err(|e| Error::invalid_graph(format!("metadata does not decode: {e}")))?;
    Ok(Peek {
        checksum: header.checksum,
        kiln_version: meta.kiln_version,
        context_models: meta.context_models,
    })
}

fn read_header(file: &mut dyn Read) -> Result<Header> {
    let mut bytes = Vec::with_capacity(HEADER_LEN);
    file.take(HEADER_LEN as u64)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::invalid_graph(format!("reading the header: {e}")))?;
    Header::parse_fixed(&bytes).map_err(|e| e.context("kiln context binary"))
}
