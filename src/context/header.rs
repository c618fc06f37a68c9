//! The fixed 64-byte header and the file layout it describes.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KILNCTX\0"
//!      8     4  format version (u32 LE)
//!     12     4  header size (u32 LE) = 64
//!     16     8  metadata offset (u64 LE) = header size
//!     24     8  metadata length (u64 LE)
//!     32     8  data offset (u64 LE) = metadata end rounded up to 64
//!     40     8  data length (u64 LE)
//!     48    16  xxh3-128 of metadata bytes then data bytes (u128 LE)
//! ```

use std::ops::Range;

use xxhash_rust::xxh3::Xxh3;

use super::{FORMAT_VERSION, MAGIC, MIN_READ_VERSION};
use crate::error::{Error, Result};
use crate::plan::STORAGE_ALIGN;

pub(crate) const HEADER_LEN: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata_len: u64,
    pub data_offset: u64,
    pub data_len: u64,
    pub checksum: u128,
}

/// `n` rounded up to a multiple of 64, or `None` on overflow.
pub(crate) fn align_up(n: u64) -> Option<u64> {
    let a = STORAGE_ALIGN as u64;
    n.checked_add(a - 1).map(|m| m / a * a)
}

/// Where the data region starts after `metadata_len` bytes of metadata.
pub(crate) fn data_offset_after(metadata_len: u64) -> Option<u64> {
    align_up((HEADER_LEN as u64).checked_add(metadata_len)?)
}

/// xxh3-128 over the metadata bytes, then the data bytes.
pub(crate) fn checksum<'a>(metadata: &[u8], data: impl IntoIterator<Item = &'a [u8]>) -> u128 {
    let mut h = Xxh3::new();
    h.update(metadata);
    for chunk in data {
        h.update(chunk);
    }
    h.digest128()
}

/// Rewrites the checksum field of `file` so that it matches the sections its
/// header names, when those lie inside the file; `false` (untouched) if not.
/// For fuzzing and tests: lets mutated bytes reach the parser behind the checksum.
pub(crate) fn recompute_checksum(file: &mut [u8]) -> bool {
    if file.len() < HEADER_LEN {
        return false;
    }
    let (metadata_len, data_offset, data_len) = (u64_at(file, 24), u64_at(file, 32), u64_at(file, 40));
    let fits = |start: u64, len: u64| start.checked_add(len).is_some_and(|end| end <= file.len() as u64);
    if !fits(HEADER_LEN as u64, metadata_len) || !fits(data_offset, data_len) {
        return false;
    }
    let metadata = &file[HEADER_LEN..HEADER_LEN + metadata_len as usize];
    let data = &file[data_offset as usize..(data_offset + data_len) as usize];
    let sum = checksum(metadata, [data]);
    file[48..64].copy_from_slice(&sum.to_le_bytes());
    true
}

impl Header {
    /// The header of a file with these sections, laid out as formats 1 and 2 say (the same layout).
    pub fn for_sections(metadata_len: u64, data_len: u64, checksum: u128) -> Result<Header> {
        let data_offset = data_offset_after(metadata_len)
            .filter(|off| off.checked_add(data_len).is_some())
            .ok_or_else(|| Error::fail("kiln context binary would exceed 2^64 bytes"))?;
        Ok(Header {
            version: FORMAT_VERSION,
            metadata_len,
            data_offset,
            data_len,
            checksum,
        })
    }

    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&(HEADER_LEN as u64).to_le_bytes());
        b[24..32].copy_from_slice(&self.metadata_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.data_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_len.to_le_bytes());
        b[48..64].copy_from_slice(&self.checksum.to_le_bytes());
        b
    }

    /// Total file size the header describes.
    pub fn file_len(&self) -> u64 {
        // Cannot overflow: `parse` and `for_sections` check it.
        self.data_offset + self.data_len
    }

    pub fn metadata_range(&self) -> Range<usize> {
        HEADER_LEN..HEADER_LEN + self.metadata_len as usize
    }

    pub fn data_range(&self) -> Range<usize> {
        self.data_offset as usize..self.file_len() as usize
    }

    /// Reads and checks the header against the whole file: magic, version,
    /// layout, size, zero padding and checksum.
    pub fn parse(file: &[u8]) -> Result<Header> {
        let h = Header::parse_fixed(file)?;
        h.check_length(file.len())?;
        h.check_padding(file)?;
        h.check_checksum(file)?;
        Ok(h)
    }

    /// Reads the header from a file's first bytes alone: magic, version,
    /// header size and the offsets the format fixes. What needs the whole file
    /// (its length, padding, checksum) is left to [`Header::parse`].
    pub fn parse_fixed(file: &[u8]) -> Result<Header> {
        check_magic(file)?;
        if file.len() < HEADER_LEN {
            return Err(truncated("the header", HEADER_LEN as u64, file.len()));
        }
        let version = u32_at(file, 8);
        check_version(version)?;
        let header_size = u32_at(file, 12);
        if header_size as usize != HEADER_LEN {
            crate::bail!(
                InvalidGraph,
                "header size is {header_size}, format {version} has {HEADER_LEN}"
            );
        }
        let h = Header {
            version,
            metadata_len: u64_at(file, 24),
            data_offset: u64_at(file, 32),
            data_len: u64_at(file, 40),
            checksum: u128::from_le_bytes(file[48..64].try_into().expect("16 bytes")),
        };
        h.check_offsets(u64_at(file, 16))?;
        Ok(h)
    }

    /// Whether the contents hash to the header's checksum; `None` if `file`
    /// does not have the length the header describes (nothing to hash).
    pub fn checksum_matches(&self, file: &[u8]) -> Option<bool> {
        self.check_length(file.len()).ok()?;
        Some(checksum(&file[self.metadata_range()], [&file[self.data_range()]]) == self.checksum)
    }

    fn check_offsets(&self, metadata_offset: u64) -> Result<()> {
        if metadata_offset != HEADER_LEN as u64 {
            crate::bail!(
                InvalidGraph,
                "metadata offset is {metadata_offset}, the format puts it right after the {HEADER_LEN}-byte header"
            );
        }
        let expected_data = data_offset_after(self.metadata_len);
        if expected_data != Some(self.data_offset) {
            crate::bail!(
                InvalidGraph,
                "data offset is {}, but {} bytes of metadata put it at {}",
                self.data_offset,
                self.metadata_len,
                expected_data.map_or("an overflowing offset".to_string(), |o| o.to_string())
            );
        }
        Ok(())
    }

    fn check_length(&self, file_len: usize) -> Result<()> {
        let Some(expected) = self.data_offset.checked_add(self.data_len) else {
            crate::bail!(InvalidGraph, "data length {} overflows", self.data_len);
        };
        if (file_len as u64) < expected {
            return Err(truncated(
                &format!(
                    "{} bytes of metadata and {} bytes of data",
                    self.metadata_len, self.data_len
                ),
                expected,
                file_len,
            ));
        }
        if file_len as u64 > expected {
            crate::bail!(
                InvalidGraph,
                "{} unexpected bytes after the data region (expected {expected} bytes, file has {file_len})",
                file_len as u64 - expected
            );
        }
        Ok(())
    }

    /// The gap between metadata and data is not checksummed, so it must be zero.
    fn check_padding(&self, file: &[u8]) -> Result<()> {
        let gap = &file[self.metadata_range().end..self.data_offset as usize];
        if gap.iter().any(|&b| b != 0) {
            crate::bail!(InvalidGraph, "padding before the data region is not zero");
        }
        Ok(())
    }

    fn check_checksum(&self, file: &[u8]) -> Result<()> {
        let actual = checksum(&file[self.metadata_range()], [&file[self.data_range()]]);
        if actual != self.checksum {
            crate::bail!(
                InvalidGraph,
                "checksum mismatch: header says {:032x}, contents hash to {actual:032x} (the file is corrupt)",
                self.checksum
            );
        }
        Ok(())
    }
}

fn check_magic(file: &[u8]) -> Result<()> {
    let n = file.len().min(MAGIC.len());
    if file[..n] != MAGIC[..n] {
        crate::bail!(InvalidGraph, "not a kiln context binary (bad magic)");
    }
    if n < MAGIC.len() {
        return Err(truncated("the header", HEADER_LEN as u64, file.len()));
    }
    Ok(())
}

fn check_version(version: u32) -> Result<()> {
    if (MIN_READ_VERSION..=FORMAT_VERSION).contains(&version) {
        return Ok(());
    }
    let which = if version > FORMAT_VERSION {
        "newer than"
    } else {
        "older than"
    };
    crate::bail!(
        InvalidGraph,
        "format version {version} is {which} what kiln {} reads (versions {MIN_READ_VERSION} to {FORMAT_VERSION}); \
         recompile the model with this kiln",
        super::KILN_VERSION
    )
}

fn truncated(what: &str, expected: u64, got: usize) -> Error {
    Error::invalid_graph(format!(
        "truncated: expected {expected} bytes for {what}, file has {got}"
    ))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
