//! Every `FETCHAHEAD_*` variable fetchahead reads, by the part that reads it, and the warning
//! about any other: a name set in the environment that nothing reads is most likely a typo.
//! Each part keeps its own settings (`store::ENV_SETTINGS`, `l2_plan::PLAN_ENV_SETTINGS`, ...);
//! this module only gathers their names.
use crate::l2_plan::PLAN_ENV_SETTINGS;
use crate::store::ENV_SETTINGS;

/// The variables outside the settings tables that fetchahead, its tests, benches and build read
/// (`FETCHAHEAD_GIT_COMMIT` is the build's, which cargo also sets for `cargo run` and `cargo
/// test`; `FETCHAHEAD_COMMIT` names the commit in `benches/triton/peers.py`'s report).
const OTHER_ENV: [&str; 11] = [
    "FETCHAHEAD_GIT_COMMIT",
    "FETCHAHEAD_COMMIT",
    crate::logging::LOG_ENV,
    crate::timeline::TIMELINE_ENV,
    crate::kernels::ptx::PTX_ARCH_ENV,
    crate::nvtx::NVTX_ENV,
    TORCH_NATIVE_ENV,
    "FETCHAHEAD_REQUIRE_GPU",
    "FETCHAHEAD_ARCHS",
    "FETCHAHEAD_TMPFS",
    "FETCHAHEAD_GAP_REPS",
];
/// The Python package's: `0` registers Python CUDA kernels for the torch ops instead of the
/// native ones (`python/src/torch_abi`).
pub const TORCH_NATIVE_ENV: &str = "FETCHAHEAD_TORCH_NATIVE";
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

/// One `FETCHAHEAD_*` setting as it stands in this process: its value and where that came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InEffect {
    pub name: &'static str,
    pub value: String,
    /// `env` (set in the environment) or `default`.
    pub source: &'static str,
    pub about: &'static str,
}

/// Every runtime setting (the row store's, the L2 plan's, logging, the timeline, NVTX) with the
/// value in effect and its source; an L2 budget's default is per device (half of `l2_bytes`,
/// `None`: no device known).
pub fn in_effect(l2_bytes: Option<u64>) -> Vec<InEffect> {
    use crate::l2_plan::PlanConfig;
    use crate::store::StoreOptions;
    let store = StoreOptions::default();
    let plan = PlanConfig::for_l2(l2_bytes.unwrap_or(0));
    let flag = |on: bool| if on { "1" } else { "0" }.to_string();
    let defaults: Vec<(&'static str, String, &'static str)> = vec![
        (
            ENV_SETTINGS[0].0,
            store.read_path.to_string(),
            ENV_SETTINGS[0].1,
        ),
        (
            ENV_SETTINGS[1].0,
            store.cache_bytes.to_string(),
            ENV_SETTINGS[1].1,
        ),
        (
            ENV_SETTINGS[2].0,
            store.uring_depth.to_string(),
            ENV_SETTINGS[2].1,
        ),
        (
            ENV_SETTINGS[3].0,
            store.preadv_threads.to_string(),
            ENV_SETTINGS[3].1,
        ),
        (ENV_SETTINGS[4].0, flag(store.direct_io), ENV_SETTINGS[4].1),
        (
            PLAN_ENV_SETTINGS[0].0,
            match l2_bytes {
                Some(_) => format!("{}", plan.budget_per_window as f64 / (1u64 << 20) as f64),
                None => "half of the device's L2".to_string(),
            },
            PLAN_ENV_SETTINGS[0].1,
        ),
        (
            PLAN_ENV_SETTINGS[1].0,
            plan.replay.name().to_string(),
            PLAN_ENV_SETTINGS[1].1,
        ),
        (
            PLAN_ENV_SETTINGS[2].0,
            format!("{:?}", plan.launch).to_lowercase(),
            PLAN_ENV_SETTINGS[2].1,
        ),
        (
            PLAN_ENV_SETTINGS[3].0,
            flag(plan.fit),
            PLAN_ENV_SETTINGS[3].1,
        ),
        (
            PLAN_ENV_SETTINGS[4].0,
            flag(plan.all_gather),
            PLAN_ENV_SETTINGS[4].1,
        ),
        (
            PLAN_ENV_SETTINGS[5].0,
            flag(plan.partitions),
            PLAN_ENV_SETTINGS[5].1,
        ),
        (
            PLAN_ENV_SETTINGS[6].0,
            flag(plan.host_pace),
            PLAN_ENV_SETTINGS[6].1,
        ),
        (
            PLAN_ENV_SETTINGS[7].0,
            plan.free_sms.to_string(),
            PLAN_ENV_SETTINGS[7].1,
        ),
        (
            PLAN_ENV_SETTINGS[8].0,
            plan.graph_sms.map_or("auto".to_string(), |n| n.to_string()),
            PLAN_ENV_SETTINGS[8].1,
        ),
        (
            crate::kernels::ptx::PTX_ARCH_ENV,
            "the device's own choice".to_string(),
            "the embedded PTX to load by arch name (sm_80, sm_90, ...)",
        ),
        (
            crate::logging::LOG_ENV,
            crate::logging::DEFAULT_LEVEL.to_string(),
            "the stderr logger's level (CLI and C library)",
        ),
        (
            crate::timeline::TIMELINE_ENV,
            "0".to_string(),
            "1: record instrumented kernels on the device timeline",
        ),
        (
            crate::nvtx::NVTX_ENV,
            "0".to_string(),
            "1: NVTX ranges for Nsight Systems and the torch profiler",
        ),
        (
            TORCH_NATIVE_ENV,
            "1".to_string(),
            "0: Python CUDA kernels for the torch ops instead of native ones (the stable ABI)",
        ),
    ];
    defaults
        .into_iter()
        .map(|(name, default, about)| match std::env::var(name) {
            Ok(v) => InEffect {
                name,
                value: v,
                source: "env",
                about,
            },
            Err(_) => InEffect {
                name,
                value: default,
                source: "default",
                about,
            },
        })
        .collect()
}
