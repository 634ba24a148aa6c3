//! The stderr logger of the CLI and the C library: `env_logger` with its level from
//! `FETCHAHEAD_LOG` (default `warn`). Nothing is written to a file.
use std::sync::Once;

/// The variable that sets the stderr logger's level (`error`, `warn`, `info`, `debug`, `trace`,
/// `off`, or `env_logger`'s `module=level` directives).
pub const LOG_ENV: &str = "FETCHAHEAD_LOG";

/// The level when `FETCHAHEAD_LOG` is unset or not a level.
pub const DEFAULT_LEVEL: &str = "warn";

/// Installs the stderr logger once per process; does nothing when another logger (an engine's,
/// or the Python package's) is already installed. A `FETCHAHEAD_LOG` that is not a level (empty,
/// a typo) logs at the default level and says so, rather than silencing every warning; a
/// `FETCHAHEAD_*` variable that nothing reads is warned about once.
pub fn init_stderr() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let value = std::env::var(LOG_ENV).ok();
        let filter = match value.as_deref() {
            Some(v) if is_log_filter(v) => v.trim().to_string(),
            _ => DEFAULT_LEVEL.to_string(),
        };
        let installed = env_logger::Builder::new()
            .parse_filters(&filter)
            .target(env_logger::Target::Stderr)
            .try_init()
            .is_ok();
        if installed
            && let Some(v) = value.as_deref()
            && !is_log_filter(v)
        {
            log::warn!(
                "fetchahead: {LOG_ENV}={v:?} is not a log level; logging at `{DEFAULT_LEVEL}` \
                 (want error, warn, info, debug, trace, off, or module=level directives)"
            );
        }
        crate::settings::warn_unknown_env();
    });
}

/// Whether `value` is a filter `env_logger` would take as meant: comma-separated directives,
/// each a level or `module=level` (a bare word that is not a level would be read as a module
/// name, silencing everything else).
pub fn is_log_filter(value: &str) -> bool {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    let is_level = |l: &str| LEVELS.iter().any(|k| k.eq_ignore_ascii_case(l.trim()));
    let directives = value.split('/').next().unwrap_or("");
    !directives.trim().is_empty()
        && directives.split(',').all(|d| match d.split_once('=') {
            Some((module, level)) => !module.trim().is_empty() && is_level(level),
            None => is_level(d),
        })
}
