//! Weights and the storage they live in: owned 64-byte-aligned bytes,
//! huge-page-backed bytes, or a memory-mapped context binary (implemented in
//! `ffi::mmap`), so that loading a program copies nothing.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Read-only bytes that weights can point into.
///
/// `bytes` must return the same slice (same address and length) on every call
/// for as long as the storage lives: weights check their bounds once, when made.
pub trait Storage: Send + Sync + fmt::Debug {
    fn bytes(&self) -> &[u8];
}

/// Alignment of [`AlignedBytes`], and of every weight in a context binary.
pub const STORAGE_ALIGN: usize = 64;

/// One 64-byte block; a `Vec` of these is 64-byte aligned without `unsafe`.
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Block([u8; STORAGE_ALIGN]);

/// 64-byte-aligned owned bytes: an embedded payload copied out of ORT, or a
/// file read into memory.
#[derive(Clone)]
pub struct AlignedBytes {
    blocks: Vec<Block>,
    len: usize,
}

impl AlignedBytes {
    /// `len` zero bytes (fill them through [`AlignedBytes::bytes_mut`]).
    pub fn zeroed(len: usize) -> Self {
        AlignedBytes {
            blocks: vec![Block([0; STORAGE_ALIGN]); len.div_ceil(STORAGE_ALIGN)],
            len,
        }
    }

    pub fn copy_from(bytes: &[u8]) -> Self {
        let mut out = AlignedBytes::zeroed(bytes.len());
        out.bytes_mut().copy_from_slice(bytes);
        out
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Block, u8>(&mut self.blocks)[..self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Zeroed bytes for a large weight, in anonymous memory starting on a 2 MiB
/// boundary whose whole 2 MiB pages are asked to be transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`, where the system offers them): a GEMM streaming
/// a weight of many MiB then takes one TLB entry per 2 MiB instead of per
/// 4 KiB. The mapping's slack (up to 2 MiB, never touched) costs address
/// space only.
pub struct HugePageBytes {
    map: memmap2::MmapMut,
    offset: usize,
    len: usize,
}

impl HugePageBytes {
    /// Huge-page granularity (x86_64).
    pub const HUGE_PAGE: usize = 2 << 20;

    /// `len` zero bytes; `Err` if the mapping fails (the caller falls back to
    /// [`AlignedBytes`]). The advice is a hint: refusing it is not an error.
    pub fn zeroed(len: usize) -> std::io::Result<HugePageBytes> {
        let total = len
            .checked_add(Self::HUGE_PAGE)
            .ok_or_else(|| std::io::Error::other("weight too large"))?;
        let map = memmap2::MmapMut::map_anon(total)?;
        let addr = map.as_ptr() as usize;
        let offset = addr.next_multiple_of(Self::HUGE_PAGE) - addr;
        // Only the whole huge pages inside the weight: the tail stays in
        // small pages, so a weight never costs more than its own bytes.
        #[cfg(target_os = "linux")]
        {
            let whole = len / Self::HUGE_PAGE * Self::HUGE_PAGE;
            if whole > 0 {
                let _ = map.advise_range(memmap2::Advice::HugePage, offset, whole);
            }
        }
        Ok(HugePageBytes { map, offset, len })
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[self.offset..self.offset + self.len]
    }
}

impl fmt::Debug for HugePageBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HugePageBytes({} bytes)", self.len)
    }
}

impl Storage for HugePageBytes {
    fn bytes(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }
}

impl Storage for AlignedBytes {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<Block, u8>(&self.blocks)[..self.len]
    }
}

impl fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBytes({} bytes)", self.len)
    }
}

/// A `Vec<f32>` used as storage as is, so `Weight::from_vec` copies nothing.
struct VecStorage(Vec<f32>);

impl Storage for VecStorage {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

impl fmt::Debug for VecStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VecStorage({} f32)", self.0.len())
    }
}

/// Bytes at `byte_offset` in `storage`, 4-byte aligned in memory. Most
/// weights are f32 ([`Weight::as_slice`]); integer and bool constants use
/// the typed views. Cloning shares the storage.
#[derive(Clone)]
pub struct Weight {
    storage: Arc<dyn Storage>,
    byte_offset: usize,
    byte_len: usize,
}

impl Weight {
    pub fn from_vec(data: Vec<f32>) -> Weight {
        let byte_len = data.len() * size_of::<f32>();
        Weight {
            storage: Arc::new(VecStorage(data)),
            byte_offset: 0,
            byte_len,
        }
    }

    /// A copy of `bytes` in 64-byte-aligned memory (any element type).
    pub fn from_bytes(bytes: &[u8]) -> Weight {
        Weight {
            byte_len: bytes.len(),
            storage: Arc::new(AlignedBytes::copy_from(bytes)),
            byte_offset: 0,
        }
    }

    /// A view of `len` f32 at `byte_offset` in `storage`, without copying.
    /// `Err(InvalidGraph)` if it is out of bounds or not 4-byte aligned in memory.
    pub fn in_storage(storage: Arc<dyn Storage>, byte_offset: usize, len: usize) -> Result<Weight> {
        let byte_len = len
            .checked_mul(size_of::<f32>())
            .ok_or_else(|| Error::invalid_graph(format!("weight of {len} f32 is too large")))?;
        Weight::in_storage_bytes(storage, byte_offset, byte_len)
    }

    /// A view of `byte_len` bytes at `byte_offset` in `storage`, without copying.
    pub fn in_storage_bytes(storage: Arc<dyn Storage>, byte_offset: usize, byte_len: usize) -> Result<Weight> {
        let bytes = storage.bytes();
        let end = byte_offset.checked_add(byte_len);
        if end.is_none_or(|end| end > bytes.len()) {
            return Err(Error::invalid_graph(format!(
                "weight of {byte_len} bytes at byte offset {byte_offset} does not fit in {} bytes of storage",
                bytes.len()
            )));
        }
        // The address, not just the offset: f32 reads need 4-byte alignment.
        let addr = bytes.as_ptr() as usize + byte_offset;
        if !addr.is_multiple_of(align_of::<f32>()) {
            return Err(Error::invalid_graph(format!(
                "weight at byte offset {byte_offset} is not 4-byte aligned in memory"
            )));
        }
        Ok(Weight {
            storage,
            byte_offset,
            byte_len,
        })
    }

    /// The bytes as f32 (a trailing partial element is ignored).
    pub fn as_slice(&self) -> &[f32] {
        let bytes = self.as_bytes();
        let n = bytes.len() / size_of::<f32>() * size_of::<f32>();
        // Cannot fail: the address is 4-byte aligned (checked when made).
        bytemuck::try_cast_slice(&bytes[..n]).unwrap_or(&[])
    }

    /// The bytes as i64, or `None` if they are not 8-byte aligned or sized.
    pub fn as_i64(&self) -> Option<&[i64]> {
        bytemuck::try_cast_slice(self.as_bytes()).ok()
    }

    /// The bytes as i32, or `None` if not a multiple of 4 bytes.
    pub fn as_i32(&self) -> Option<&[i32]> {
        bytemuck::try_cast_slice(self.as_bytes()).ok()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.storage.bytes()[self.byte_offset..self.byte_offset + self.byte_len]
    }

    /// f32 elements (`byte_len / 4`).
    pub fn len(&self) -> usize {
        self.byte_len / size_of::<f32>()
    }

    pub fn is_empty(&self) -> bool {
        self.byte_len == 0
    }

    pub fn byte_len(&self) -> usize {
        self.byte_len
    }

    /// Whether this weight's bytes live inside `storage` (proof that nothing was copied).
    pub fn shares_storage_with(&self, storage: &Arc<dyn Storage>) -> bool {
        let outer = storage.bytes().as_ptr_range();
        let inner = self.as_bytes().as_ptr_range();
        outer.start <= inner.start && inner.end <= outer.end
    }
}

impl Deref for Weight {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        self.as_slice()
    }
}

impl From<Vec<f32>> for Weight {
    fn from(data: Vec<f32>) -> Weight {
        Weight::from_vec(data)
    }
}

impl fmt::Debug for Weight {
    // Sizes, not values: weights can be large.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Weight({} bytes at byte {} of {:?})",
            self.byte_len, self.byte_offset, self.storage
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn storage(values: &[f32]) -> Arc<dyn Storage> {
        Arc::new(AlignedBytes::copy_from(bytemuck::cast_slice(values)))
    }

    #[test]
    fn aligned_bytes_are_aligned_and_exact() {
        for len in [0, 1, 63, 64, 65, 200] {
            let mut a = AlignedBytes::zeroed(len);
            assert_eq!(a.len(), len);
            assert_eq!(a.bytes().len(), len);
            assert_eq!(a.bytes().as_ptr() as usize % STORAGE_ALIGN, 0);
            a.bytes_mut().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            let b = AlignedBytes::copy_from(a.bytes());
            assert_eq!(a.bytes(), b.bytes());
        }
        assert!(AlignedBytes::zeroed(0).is_empty());
        assert_eq!(format!("{:?}", AlignedBytes::zeroed(3)), "AlignedBytes(3 bytes)");
    }

    #[test]
    fn from_vec_keeps_values() {
        let w = Weight::from_vec(vec![1.0, -2.5, 3.0]);
        assert_eq!(w.as_slice(), &[1.0, -2.5, 3.0]);
        assert_eq!(w.len(), 3);
        assert_eq!(w.byte_len(), 12);
        assert_eq!(w.as_bytes(), bytemuck::cast_slice::<f32, u8>(&[1.0, -2.5, 3.0]));
        assert_eq!(&w[1..], &[-2.5, 3.0]);
        let empty = Weight::from(Vec::new());
        assert!(empty.is_empty() && empty.as_slice().is_empty());
    }

    #[test]
    fn in_storage_views_without_copying() {
        let s = storage(&[0.0, 1.0, 2.0, 3.0, 4.0]);
        let w = Weight::in_storage(s.clone(), 8, 3).unwrap();
        assert_eq!(w.as_slice(), &[2.0, 3.0, 4.0]);
        assert!(w.shares_storage_with(&s));
        assert!(!Weight::from_vec(vec![2.0]).shares_storage_with(&s));
        let other = storage(&[2.0, 3.0, 4.0]);
        assert!(!w.shares_storage_with(&other));
        assert!(Weight::in_storage(s.clone(), 20, 0).unwrap().is_empty());
        assert!(format!("{w:?}").contains("12 bytes at byte 8"));
    }

    #[test]
    fn in_storage_checks_bounds_and_alignment() {
        let s = storage(&[0.0; 4]);
        let bad = [(0, 5), (4, 4), (17, 0), (2, 1), (usize::MAX, 1), (0, usize::MAX / 2)];
        for (offset, len) in bad {
            let e = Weight::in_storage(s.clone(), offset, len).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidGraph, "{offset} {len}");
        }
    }
}
