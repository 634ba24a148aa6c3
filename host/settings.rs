//! Every `FETCHAHEAD_*` variable fetchahead reads, by the part that reads it, and the warning
//! about any other: a name set in the environment that nothing reads is most likely a typo.
//! Each part keeps its own settings (`store::ENV_SETTINGS`, `l2_plan::PLAN_ENV_SETTINGS`, ...);
//! this module only gathers their names.
use crate::l2_plan::PLAN_ENV_SETTINGS;
use crate::store::ENV_SETTINGS;

/// The variables outside the settings tables that fetchahead, its tests, benches and build read.
const OTHER_ENV: [&str; 8] = [
    crate::logging::LOG_ENV,
    crate::timeline::TIMELINE_ENV,
    crate::kernels::ptx::PTX_ARCH_ENV,
    "FETCHAHEAD_REQUIRE_GPU",
    "FETCHAHEAD_ARCHS",
    "FETCHAHEAD_TMPFS",
    "FETCHAHEAD_GAP_REPS",
    "FETCHAHEAD_WINNERS_OUT",
];
/// Prefixes of the benches' and tests' own variables.
const OTHER_ENV_PREFIXES: [&str; 2] = ["FETCHAHEAD_BENCH_", "FETCHAHEAD_TEST_"];

/// Every variable of a settings table, named.
pub fn known_settings() -> impl Iterator<Item = &'static str> {
    ENV_SETTINGS
        .iter()
        .chain(PLAN_ENV_SETTINGS.iter())
        .map(|(name, _)| *name)
}

/// The `FETCHAHEAD_*` names among `names` that no part of fetchahead reads.
pub fn unknown_env_names(names: impl IntoIterator<Item = String>) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| n.starts_with("FETCHAHEAD_"))
        .filter(|n| {
            !known_settings().any(|k| k == n)
                && !OTHER_ENV.contains(&n.as_str())
                && !OTHER_ENV_PREFIXES.iter().any(|p| n.starts_with(p))
        })
        .collect()
}

/// Warns once per process about each `FETCHAHEAD_*` variable set here that nothing reads
/// (called when the stderr logger is installed, and by the Python package at import).
pub fn warn_unknown_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
        for name in unknown_env_names(names) {
            log::warn!(
                "fetchahead: {name} is set but is not a fetchahead variable (a typo?); the \
                 settings are {}, and {}",
                known_settings().collect::<Vec<_>>().join(", "),
                crate::logging::LOG_ENV
            );
        }
    });
}
