//! The compatibility string ORT stores next to a compiled model, and the
//! verdict on it for a device.
//!
//! Grammar (fields separated by `;`, the first is the literal `kiln`, the rest
//! `key=value` in any order; unknown keys are ignored so later writers can
//! add some; `format`, `version` and `target` are required, once each):
//!
//! ```text
//! info    = "kiln" *( ";" key "=" value )
//! format  = decimal u32                  ; context format version
//! version = semver                       ; kiln that compiled it
//! target  = target name                  ; e.g. x86_64-avx512
//! ```

use super::{FORMAT_VERSION, KILN_VERSION, MIN_READ_VERSION};
use crate::target::Target;

/// How well a compiled model suits a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compatibility {
    /// Use it as is.
    Optimal,
    /// It runs, but recompiling would give a better result.
    PreferRecompilation,
    /// It cannot be used here.
    Unsupported,
}

/// e.g. `kiln;format=10;version=0.1.0;target=x86_64-avx512`.
pub fn compatibility_info(target: Target) -> String {
    format!(
        "kiln;format={FORMAT_VERSION};version={KILN_VERSION};target={}",
        target.name()
    )
}

/// The verdict on a compatibility string for a device whose best target is
/// `device_best`, and why:
/// not kiln's or unparsable, a format this kiln cannot read, or a target the
/// device cannot run: Unsupported; a target below the device's best, an
/// older format (readable, but without shape-generic graphs) or an older
/// kiln: PreferRecompilation; otherwise Optimal.
pub fn check_compatibility(info: &str, device_best: Target) -> (Compatibility, String) {
    use Compatibility::*;
    let fields = match Fields::parse(info) {
        Ok(f) => f,
        Err(why) => {
            return (
                Unsupported,
                format!("not a kiln compatibility string ({why}): '{info}'"),
            )
        }
    };
    if !(MIN_READ_VERSION..=FORMAT_VERSION).contains(&fields.format) {
        let why = format!(
            "context format {} is not readable by kiln {KILN_VERSION} (reads {MIN_READ_VERSION} to {FORMAT_VERSION})",
            fields.format
        );
        return (Unsupported, why);
    }
    if !fields.target.can_run_on(device_best) {
        let why = format!(
            "compiled for {} but the device supports at most {device_best}",
            fields.target
        );
        return (Unsupported, why);
    }
    if fields.target < device_best {
        let why = format!(
            "compiled for {} but the device supports {device_best}; recompiling would be faster",
            fields.target
        );
        return (PreferRecompilation, why);
    }
    if fields.format < FORMAT_VERSION {
        let why = format!(
            "written in context format {} and this kiln writes {FORMAT_VERSION}; recompiling may be better",
            fields.format
        );
        return (PreferRecompilation, why);
    }
    if fields.version < SemVer::ours() {
        let why = format!(
            "compiled by kiln {} and this is kiln {KILN_VERSION}; recompiling may be better",
            fields.version_text
        );
        return (PreferRecompilation, why);
    }
    (
        Optimal,
        format!("compiled for {} by kiln {}", fields.target, fields.version_text),
    )
}

/// The required fields of a compatibility string.
struct Fields {
    format: u32,
    version: SemVer,
    version_text: String,
    target: Target,
}

impl Fields {
    fn parse(info: &str) -> Result<Fields, String> {
        let mut parts = info.trim().split(';');
        if parts.next() != Some("kiln") {
            return Err("it does not start with 'kiln'".into());
        }
        let (mut format, mut version, mut target) = (None, None, None);
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not key=value"))?;
            let slot = match key {
                "format" => &mut format,
                "version" => &mut version,
                "target" => &mut target,
                _ => continue,
            };
            if slot.replace(value).is_some() {
                return Err(format!("'{key}' is given twice"));
            }
        }
        let format = format.ok_or("no format")?;
        let version_text = version.ok_or("no version")?;
        let target = target.ok_or("no target")?;
        Ok(Fields {
            format: format.parse().map_err(|_| format!("bad format '{format}'"))?,
            version: SemVer::parse(version_text).ok_or_else(|| format!("bad version '{version_text}'"))?,
            version_text: version_text.to_string(),
            target: Target::parse(target).ok_or_else(|| format!("unknown target '{target}'"))?,
        })
    }
}

/// A semantic version, ordered by SemVer 2.0 precedence (build metadata ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SemVer {
    core: [u64; 3],
    /// Pre-release identifiers; empty for a release.
    pre: Vec<Ident>,
}

/// A pre-release identifier: numeric ones sort below alphanumeric ones.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ident {
    Num(u64),
    Text(String),
}

impl SemVer {
    fn ours() -> SemVer {
        SemVer::parse(KILN_VERSION).unwrap_or(SemVer {
            core: [0; 3],
            pre: Vec::new(),
        })
    }

    fn parse(s: &str) -> Option<SemVer> {
        let s = s.split_once('+').map_or(s, |(v, _build)| v);
        let (core, pre) = s.split_once('-').map_or((s, None), |(c, p)| (c, Some(p)));
        let nums: Vec<u64> = core.split('.').map(number).collect::<Option<_>>()?;
        let core: [u64; 3] = nums.try_into().ok()?;
        let pre = match pre {
            None => Vec::new(),
            Some(p) => p.split('.').map(ident).collect::<Option<_>>()?,
        };
        Some(SemVer { core, pre })
    }
}

fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn ident(s: &str) -> Option<Ident> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return None;
    }
    Some(number(s).map_or_else(|| Ident::Text(s.to_string()), Ident::Num))
}

impl PartialOrd for SemVer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SemVer {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // A release sorts above its pre-releases; otherwise identifiers in order.
        self.core
            .cmp(&other.core)
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                (false, false) => self.pre.cmp(&other.pre),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Compatibility::*;

    fn info(format: u32, version: &str, target: &str) -> String {
        format!("kiln;format={format};version={version};target={target}")
    }

    #[test]
    fn info_round_trips_as_optimal() {
        for t in Target::ALL {
            let s = compatibility_info(t);
            assert_eq!(s, info(FORMAT_VERSION, KILN_VERSION, t.name()));
            let (c, why) = check_compatibility(&s, t);
            assert_eq!(c, Optimal, "{why}");
            assert!(why.contains(t.name()), "{why}");
        }
        assert_eq!(
            compatibility_info(Target::Avx512),
            format!("kiln;format={FORMAT_VERSION};version={KILN_VERSION};target=x86_64-avx512")
        );
    }

    #[test]
    fn not_kiln_or_unparsable_is_unsupported() {
        let bad = [
            "",
            "kiln",
            "other;format=1;version=0.1.0;target=x86_64-generic",
            "kiln;format=1;version=0.1.0",
            "kiln;format=x;version=0.1.0;target=x86_64-generic",
            "kiln;format=1;version=0.1;target=x86_64-generic",
            "kiln;format=1;version=0.1.0.0;target=x86_64-generic",
            "kiln;format=1;version=0.1.0-;target=x86_64-generic",
            "kiln;format=1;version=0.1.0;target=arm64",
            "kiln;format=1;format=1;version=0.1.0;target=x86_64-generic",
            "kiln;format=1;version=0.1.0;target",
        ];
        for s in bad {
            let (c, why) = check_compatibility(s, Target::Avx512);
            assert_eq!(c, Unsupported, "{s}: {why}");
            assert!(why.contains("not a kiln compatibility string"), "{why}");
        }
    }

    #[test]
    fn unreadable_format_is_unsupported() {
        for f in [0, FORMAT_VERSION + 1, u32::MAX] {
            let (c, why) = check_compatibility(&info(f, KILN_VERSION, "x86_64-generic"), Target::Generic);
            assert_eq!(c, Unsupported);
            assert!(
                why.contains(&format!("format {f}")) && why.contains(&format!("reads 1 to {FORMAT_VERSION}")),
                "{why}"
            );
        }
    }

    #[test]
    fn older_readable_format_prefers_recompilation() {
        let (c, why) = check_compatibility(&info(1, KILN_VERSION, "x86_64-generic"), Target::Generic);
        assert_eq!(c, PreferRecompilation);
        assert!(
            why.contains("context format 1") && why.contains(&format!("writes {FORMAT_VERSION}")),
            "{why}"
        );
        // an unsupported target still wins
        let (c, _) = check_compatibility(&info(1, KILN_VERSION, "x86_64-avx512"), Target::Avx2);
        assert_eq!(c, Unsupported);
    }

    #[test]
    fn targets_decide_between_all_three() {
        let at = |compiled: Target, device: Target| {
            check_compatibility(&info(FORMAT_VERSION, KILN_VERSION, compiled.name()), device).0
        };
        assert_eq!(at(Target::Avx512, Target::Avx2), Unsupported);
        assert_eq!(at(Target::Avx2, Target::Generic), Unsupported);
        assert_eq!(at(Target::Avx2, Target::Avx512), PreferRecompilation);
        assert_eq!(at(Target::Generic, Target::Avx2), PreferRecompilation);
        assert_eq!(at(Target::Avx2, Target::Avx2), Optimal);
        let (_, why) = check_compatibility(&info(FORMAT_VERSION, KILN_VERSION, "x86_64-avx512"), Target::Generic);
        assert!(why.contains("x86_64-avx512") && why.contains("x86_64-generic"), "{why}");
    }

    #[test]
    fn older_kiln_prefers_recompilation_newer_is_fine() {
        let at = |v: &str| check_compatibility(&info(FORMAT_VERSION, v, "x86_64-generic"), Target::Generic);
        let (c, why) = at("0.0.9");
        assert_eq!(c, PreferRecompilation);
        assert!(why.contains("0.0.9"), "{why}");
        assert_eq!(at("0.1.0-alpha.1").0, PreferRecompilation);
        assert_eq!(at("0.1.0+build.7").0, Optimal);
        assert_eq!(at("0.1.1").0, Optimal);
        assert_eq!(at("1.0.0-rc.1").0, Optimal);
        // Unsupported target wins over an old version.
        let (c, _) = check_compatibility(&info(FORMAT_VERSION, "0.0.1", "x86_64-avx512"), Target::Avx2);
        assert_eq!(c, Unsupported);
    }

    #[test]
    fn extra_fields_and_order_do_not_matter() {
        let s = format!("kiln;target=x86_64-avx2;packing=none;version={KILN_VERSION};format={FORMAT_VERSION}");
        assert_eq!(check_compatibility(&s, Target::Avx2).0, Optimal);
    }

    #[test]
    fn semver_precedence() {
        let v = |s: &str| SemVer::parse(s).unwrap();
        let order = [
            "0.9.9",
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.10",
            "1.2.0",
            "10.0.0",
        ];
        for w in order.windows(2) {
            assert!(v(w[0]) < v(w[1]), "{} < {}", w[0], w[1]);
        }
        assert_eq!(v("1.0.0+a"), v("1.0.0+b"));
        for bad in ["", "1", "1.2", "a.b.c", "1.2.3-", "1.2.3-a..b", "-1.2.3", "1.2.3-a_b"] {
            assert!(SemVer::parse(bad).is_none(), "{bad}");
        }
    }
}
