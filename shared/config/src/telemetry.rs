//! Tracing set-up for both binaries: logs on stderr, text or JSON, filtered by
//! `RUST_LOG` (default `info`).

use tracing_subscriber::{EnvFilter, fmt};

use crate::LogFormat;

/// Installs the global subscriber. Call once, from `main`.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log file or a collector gets
    // plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).init(),
    }
}
