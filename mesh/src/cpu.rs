//! The CPU features this binary was compiled to assume, checked against the CPU it
//! runs on before anything else happens.
//!
//! Rust code compiled with `-C target-cpu=x86-64-v3` (or `native`) uses AVX2, FMA and
//! friends without asking the CPU first; on a CPU without them the first such
//! instruction is SIGILL, a crash with no message. `mesh` checks at start instead and
//! refuses with one line that names what is missing and how to build for this CPU.
//! (candle's matrix products dispatch on the CPU at run time in any build; the
//! compile-time target matters for the code around them. README: "CPU targets".)

/// One CPU feature: whether this build assumes it, and whether this CPU has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    pub name: &'static str,
    pub assumed: bool,
    pub present: bool,
}

/// The features an x86-64-v2/v3/v4 build may assume, each with the two answers.
#[cfg(target_arch = "x86_64")]
pub fn features() -> Vec<Feature> {
    macro_rules! f {
        ($($name:tt),*) => {
            vec![$(Feature {
                name: $name,
                assumed: cfg!(target_feature = $name),
                present: std::arch::is_x86_feature_detected!($name),
            }),*]
        };
    }
    f!(
        "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2",
        "f16c", "lzcnt", "movbe", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"
    )
}

/// Other architectures: nothing to check here (the target's baseline is assumed).
#[cfg(not(target_arch = "x86_64"))]
pub fn features() -> Vec<Feature> {
    Vec::new()
}

/// The features this build assumes and this CPU lacks.
pub fn missing(features: &[Feature]) -> Vec<&'static str> {
    features
        .iter()
        .filter(|f| f.assumed && !f.present)
        .map(|f| f.name)
        .collect()
}

/// Ok when this CPU runs everything this build assumes; otherwise the message to
/// print before exiting.
pub fn check() -> Result<(), String> {
    let features = features();
    let missing = missing(&features);
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "this mesh binary was built for CPUs with {} ({}), and this CPU lacks {}; \
         rebuild with `scripts/build-release` (portable, the default) or \
         `MESH_CPU=native scripts/build-release`",
        assumed(&features).join(", "),
        built_for(),
        missing.join(", ")
    ))
}

/// The features this build assumes beyond the architecture's baseline.
pub fn assumed(features: &[Feature]) -> Vec<&'static str> {
    features
        .iter()
        .filter(|f| f.assumed)
        .map(|f| f.name)
        .collect()
}

/// The x86-64 microarchitecture level this build assumes (`x86-64`, `-v2`, `-v3`,
/// `-v4`), from the features it was compiled with.
pub fn built_for() -> &'static str {
    level(|name| features().iter().any(|f| f.name == name && f.assumed))
}

/// The level this CPU supports.
pub fn cpu_level() -> &'static str {
    level(|name| features().iter().any(|f| f.name == name && f.present))
}

fn level(has: impl Fn(&str) -> bool) -> &'static str {
    let all = |names: &[&str]| names.iter().all(|n| has(n));
    if !cfg!(target_arch = "x86_64") {
        return std::env::consts::ARCH;
    }
    let v2 = all(&["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"]);
    let v3 = v2
        && all(&[
            "avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "lzcnt", "movbe",
        ]);
    let v4 = v3 && all(&["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"]);
    match (v2, v3, v4) {
        (_, _, true) => "x86-64-v4",
        (_, true, _) => "x86-64-v3",
        (true, _, _) => "x86-64-v2",
        _ => "x86-64",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &'static str, assumed: bool, present: bool) -> Feature {
        Feature {
            name,
            assumed,
            present,
        }
    }

    #[test]
    fn a_feature_the_build_assumes_and_the_cpu_lacks_is_named() {
        let list = [
            f("avx2", true, false),
            f("fma", true, true),
            f("avx512f", false, false),
        ];
        assert_eq!(missing(&list), vec!["avx2"]);
        assert_eq!(assumed(&list), vec!["avx2", "fma"]);
    }

    #[test]
    fn nothing_is_missing_when_the_cpu_has_more_than_the_build_assumes() {
        let list = [f("avx2", false, true), f("fma", true, true)];
        assert!(missing(&list).is_empty());
    }

    #[test]
    fn levels_follow_the_psabi_feature_sets() {
        let v3 = [
            "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2",
            "f16c", "lzcnt", "movbe",
        ];
        if cfg!(target_arch = "x86_64") {
            assert_eq!(level(|n| v3.contains(&n)), "x86-64-v3");
            assert_eq!(level(|n| v3[..5].contains(&n)), "x86-64-v2");
            assert_eq!(level(|n| n != "movbe" && v3.contains(&n)), "x86-64-v2");
            assert_eq!(level(|_| false), "x86-64");
        }
    }

    #[test]
    fn this_test_binary_runs_on_this_cpu() {
        // The test binary was built with the same flags as the mesh binary: if it
        // assumed a feature this CPU lacks, it would not have got this far, and
        // check() must agree.
        assert_eq!(check(), Ok(()));
    }
}
