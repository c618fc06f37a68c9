//! The host's data-cache sizes, as the CPU reports them, for the GEMM's
//! cache blocking (issue #14: blocking derived from the caches, not from
//! constants tuned on one machine).
//!
//! Read once with CPUID: leaf `0x8000001D` on AMD (and Hygon), which
//! describes the caches when the CPU has `TOPOEXT`, else Intel's leaf 4.
//! Both list one cache per sub-leaf in the same format.

use std::sync::OnceLock;

/// Sizes in bytes of one core's L1 data cache and L2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caches {
    pub l1d: usize,
    pub l2: usize,
}

/// This CPU's caches, or `None` when CPUID does not describe them (another
/// architecture, an old CPU, a hypervisor hiding the leaves).
pub fn host() -> Option<Caches> {
    static HOST: OnceLock<Option<Caches>> = OnceLock::new();
    *HOST.get_or_init(detect)
}

/// One entry of a cache-description leaf: `(type, level, bytes)`, or `None`
/// past the last cache (type 0).
fn describe(eax: u32, ebx: u32, ecx: u32) -> Option<(u32, u32, usize)> {
    let kind = eax & 0x1f;
    if kind == 0 {
        return None;
    }
    let level = (eax >> 5) & 0x7;
    let line = (ebx & 0xfff) as usize + 1;
    let partitions = ((ebx >> 12) & 0x3ff) as usize + 1;
    let ways = ((ebx >> 22) & 0x3ff) as usize + 1;
    let sets = ecx as usize + 1;
    Some((kind, level, ways * partitions * line * sets))
}

/// The L1 data (type 1) and L2 (data or unified, type 1 or 3) sizes among
/// the entries `leaf(0), leaf(1), ...` up to the first empty one.
fn from_entries(mut leaf: impl FnMut(u32) -> (u32, u32, u32)) -> Option<Caches> {
    let (mut l1d, mut l2) = (None, None);
    for sub in 0..16 {
        let (eax, ebx, ecx) = leaf(sub);
        let Some((kind, level, bytes)) = describe(eax, ebx, ecx) else {
            break;
        };
        match (level, kind) {
            (1, 1) => l1d = Some(bytes),
            (2, 1 | 3) => l2 = Some(bytes),
            _ => {}
        }
    }
    Some(Caches { l1d: l1d?, l2: l2? })
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code, unused_unsafe)] // CPUID is safe to call in newer Rust, unsafe in older
fn detect() -> Option<Caches> {
    use std::arch::x86_64::__cpuid_count;
    // SAFETY: CPUID exists on every x86_64 CPU; a leaf above the maximum
    // reported returns unspecified values, which the maxima below avoid.
    let cpuid = |leaf: u32, sub: u32| unsafe { __cpuid_count(leaf, sub) };
    let max_ext = cpuid(0x8000_0000, 0).eax;
    let topoext = max_ext >= 0x8000_0001 && cpuid(0x8000_0001, 0).ecx & (1 << 22) != 0;
    let leaf = if topoext && max_ext >= 0x8000_001d {
        0x8000_001d
    } else if cpuid(0, 0).eax >= 4 {
        4
    } else {
        return None;
    };
    from_entries(|sub| {
        let r = cpuid(leaf, sub);
        (r.eax, r.ebx, r.ecx)
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Option<Caches> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry: type, level, ways, line bytes, sets (one partition).
    fn entry(kind: u32, level: u32, ways: u32, line: u32, sets: u32) -> (u32, u32, u32) {
        (kind | level << 5, (line - 1) | (ways - 1) << 22, sets - 1)
    }

    #[test]
    fn reads_l1d_and_l2_from_entries() {
        // Zen 3's list: L1d 32 KiB (8-way, 64 sets), L1i, L2 512 KiB (8-way, 1024 sets), L3.
        let list = [
            entry(1, 1, 8, 64, 64),
            entry(2, 1, 8, 64, 64),
            entry(3, 2, 8, 64, 1024),
            entry(3, 3, 16, 64, 32768),
            (0, 0, 0),
        ];
        let caches = from_entries(|sub| list[sub as usize]);
        assert_eq!(
            caches,
            Some(Caches {
                l1d: 32 << 10,
                l2: 512 << 10
            })
        );
    }

    #[test]
    fn missing_l2_is_none() {
        let list = [entry(1, 1, 8, 64, 64), (0, 0, 0)];
        assert_eq!(from_entries(|sub| list[sub as usize]), None);
    }

    /// Linux's view of cpu0's caches: (level, type, bytes) per `index*`.
    fn sysfs_caches() -> Vec<(u32, String, usize)> {
        let read = |dir: &std::path::Path, f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let Ok(entries) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let dir = e.path();
                let level = read(&dir, "level")?.trim().parse().ok()?;
                let kind = read(&dir, "type")?.trim().to_string();
                let size = read(&dir, "size")?;
                let kib: usize = size.trim().strip_suffix('K')?.parse().ok()?;
                Some((level, kind, kib << 10))
            })
            .collect()
    }

    #[test]
    fn host_caches_agree_with_linux() {
        let linux = sysfs_caches();
        let find = |level: u32, kinds: &[&str]| {
            linux
                .iter()
                .find(|(l, k, _)| *l == level && kinds.contains(&k.as_str()))
                .map(|c| c.2)
        };
        let (Some(l1d), Some(l2)) = (find(1, &["Data"]), find(2, &["Unified", "Data"])) else {
            // No sysfs cache description (not Linux, or a container hiding it).
            return;
        };
        assert_eq!(host(), Some(Caches { l1d, l2 }), "CPUID against /sys: {linux:?}");
    }
}
