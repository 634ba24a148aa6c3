//! The stderr logger of the CLI and the C library: `env_logger` with its level from
//! `FETCHAHEAD_LOG` (default `warn`). Nothing is written to a file.
use std::sync::Once;

/// The variable that sets the stderr logger's level (`error`, `warn`, `info`, `debug`, `trace`,
/// `off`, or `env_logger`'s `module=level` directives).
pub const LOG_ENV: &str = "FETCHAHEAD_LOG";

/// Installs the stderr logger once per process; does nothing when another logger (an engine's,
/// or the Python package's) is already installed.
pub fn init_stderr() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let env = env_logger::Env::new().filter_or(LOG_ENV, "warn");
        let _ = env_logger::Builder::from_env(env)
            .target(env_logger::Target::Stderr)
            .try_init();
    });
}
