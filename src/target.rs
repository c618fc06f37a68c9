//! CPU targets kiln compiles for, and which of them this host can run.
//!
//! A compiled program is tied to one target. The target decides which kernel
//! variant runs, so kiln never guesses at run time: it picks the target once,
//! when compiling, from [`Target::detect_host`].

use std::fmt;

use crate::error::{Error, Result};

/// A CPU instruction-set level, ordered by capability (`Generic < Avx2 < Avx512`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Baseline x86_64 (SSE2).
    Generic,
    /// AVX2 + FMA.
    Avx2,
    /// AVX-512F/BW/VL + FMA.
    Avx512,
}

/// Environment variable that lowers what kiln believes the host supports,
/// e.g. `KILN_MAX_TARGET=x86_64-avx2` to test the AVX2 path on an AVX-512 machine.
pub const MAX_TARGET_ENV: &str = "KILN_MAX_TARGET";

impl Target {
    /// Every target, best first.
    pub const ALL: [Target; 3] = [Target::Avx512, Target::Avx2, Target::Generic];

    pub fn name(self) -> &'static str {
        match self {
            Target::Generic => "x86_64-generic",
            Target::Avx2 => "x86_64-avx2",
            Target::Avx512 => "x86_64-avx512",
        }
    }

    /// Parses an exact target name, ignoring case and surrounding spaces.
    pub fn parse(s: &str) -> Option<Target> {
        let s = s.trim();
        Target::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s))
    }

    pub fn description(self) -> &'static str {
        match self {
            Target::Generic => "SSE2",
            Target::Avx2 => "AVX2 + FMA",
            Target::Avx512 => "AVX-512F/BW/VL + FMA",
        }
    }

    /// Whether code compiled for `self` runs on a host whose best target is `host`.
    pub fn can_run_on(self, host: Target) -> bool {
        self <= host
    }

    /// The best target this CPU supports, capped by `KILN_MAX_TARGET` if set.
    pub fn detect_host() -> Result<Target> {
        let cap = std::env::var(MAX_TARGET_ENV).ok();
        Target::host_with_cap(Target::cpu_best(), cap.as_deref())
    }

    /// `cpu_best` lowered to `cap` when `cap` names a lower target.
    /// An empty cap counts as unset; an unknown one is an error.
    pub fn host_with_cap(cpu_best: Target, cap: Option<&str>) -> Result<Target> {
        let cap = match cap.map(str::trim) {
            None | Some("") => return Ok(cpu_best),
            Some(s) => s,
        };
        match Target::parse(cap) {
            Some(limit) => Ok(cpu_best.min(limit)),
            None => Err(Error::invalid_argument(format!(
                "{MAX_TARGET_ENV}={cap:?} is not a kiln target; accepted values: {}",
                Target::accepted_names()
            ))),
        }
    }

    /// The best target this CPU supports, ignoring the environment.
    #[cfg(target_arch = "x86_64")]
    pub fn cpu_best() -> Target {
        // std caches the CPUID results, so this is cheap enough to call per run.
        let fma = std::arch::is_x86_feature_detected!("fma");
        let avx2 = fma && std::arch::is_x86_feature_detected!("avx2");
        let avx512 = avx2
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl");
        if avx512 {
            Target::Avx512
        } else if avx2 {
            Target::Avx2
        } else {
            Target::Generic
        }
    }

    /// The best target this CPU supports, ignoring the environment.
    #[cfg(not(target_arch = "x86_64"))]
    pub fn cpu_best() -> Target {
        Target::Generic
    }

    fn accepted_names() -> String {
        let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
        names.join(", ")
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn order_is_by_capability() {
        assert!(Target::Generic < Target::Avx2 && Target::Avx2 < Target::Avx512);
        assert_eq!(Target::ALL, [Target::Avx512, Target::Avx2, Target::Generic]);
    }

    #[test]
    fn names_round_trip_case_insensitively() {
        for t in Target::ALL {
            assert_eq!(Target::parse(t.name()), Some(t));
            assert_eq!(Target::parse(&t.name().to_uppercase()), Some(t));
            assert!(!t.description().is_empty());
        }
        assert_eq!(Target::parse("avx2"), None);
        assert_eq!(Target::parse(""), None);
        assert_eq!(Target::Avx512.to_string(), "x86_64-avx512");
    }

    #[test]
    fn can_run_on_means_not_newer() {
        assert!(Target::Generic.can_run_on(Target::Avx512));
        assert!(Target::Avx2.can_run_on(Target::Avx2));
        assert!(!Target::Avx512.can_run_on(Target::Avx2));
        assert!(!Target::Avx2.can_run_on(Target::Generic));
    }

    #[test]
    fn cap_lowers_but_never_raises() {
        let h = |best, cap| Target::host_with_cap(best, cap).unwrap();
        assert_eq!(h(Target::Avx512, None), Target::Avx512);
        assert_eq!(h(Target::Avx512, Some("")), Target::Avx512);
        assert_eq!(h(Target::Avx512, Some("x86_64-avx2")), Target::Avx2);
        assert_eq!(h(Target::Avx512, Some(" X86_64-GENERIC ")), Target::Generic);
        assert_eq!(h(Target::Avx2, Some("x86_64-avx512")), Target::Avx2);
    }

    #[test]
    fn bad_cap_names_variable_and_choices() {
        let err = Target::host_with_cap(Target::Avx2, Some("sse9")).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(MAX_TARGET_ENV), "{err}");
        assert!(err.message.contains("sse9"), "{err}");
        for t in Target::ALL {
            assert!(err.message.contains(t.name()), "{err}");
        }
    }

    #[test]
    fn detected_host_is_consistent_with_cpu() {
        // The env var may be set by whoever runs the tests; either way the
        // result is never above what the CPU has.
        if let Ok(host) = Target::detect_host() {
            assert!(host.can_run_on(Target::cpu_best()));
        }
    }
}
