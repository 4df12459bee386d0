//! `webhooks-api serve` settings: the shared ones plus the API's own.

use std::net::SocketAddr;

use clap::Args;
use shared::config::{CommonConfig, Secret};

/// Everything `serve` needs, loaded once and validated at start.
#[derive(Debug, Clone, Args)]
pub struct Config {
    #[command(flatten)]
    pub common: CommonConfig,

    /// Where the public `/v0` API listens.
    #[arg(long, env = "API_LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    pub api_listen_addr: SocketAddr,

    /// Where `/internal/events`, `/healthz`, `/readyz` and `/metrics` listen;
    /// keep it off the public network.
    #[arg(long, env = "INTERNAL_LISTEN_ADDR", default_value = "127.0.0.1:8081")]
    pub internal_listen_addr: SocketAddr,

    /// When set, the internal listener requires `Authorization: Bearer <token>`.
    #[arg(long, env = "INTERNAL_TOKEN", hide_env_values = true)]
    pub internal_token: Option<Secret>,

    /// Non-deleted endpoints a developer may have.
    #[arg(long, env = "MAX_ENDPOINTS_PER_DEVELOPER", default_value_t = 5)]
    pub max_endpoints_per_developer: u32,

    /// Largest request body accepted on the public API, in bytes.
    #[arg(long, env = "MAX_REQUEST_BYTES", default_value_t = 64 * 1024)]
    pub max_request_bytes: usize,

    /// Largest event accepted on `POST /internal/events`, in bytes.
    #[arg(long, env = "MAX_EVENT_BYTES", default_value_t = 256 * 1024)]
    pub max_event_bytes: usize,

    /// Sustained public API requests per second per developer (all its keys
    /// together) on this instance; beyond it requests answer 429
    /// `rate_limited` with `Retry-After`. 0 switches the limit off.
    #[arg(long, env = "RATE_LIMIT_PER_SECOND", default_value_t = 100)]
    pub rate_limit_per_second: u32,

    /// Requests a developer may make at once above the sustained rate.
    #[arg(long, env = "RATE_LIMIT_BURST", default_value_t = 200)]
    pub rate_limit_burst: u32,
}

impl Config {
    /// Parses settings from flags (`--database-url …`), falling back to the
    /// environment and then the defaults, as `serve` does. Tests use this to
    /// configure an instance without touching the process environment.
    pub fn from_args<I, T>(args: I) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        shared::config::parse_args("webhooks-api", args)
    }

    /// Checks what clap's types cannot express.
    pub fn validate(&self) -> Result<(), String> {
        self.common.validate()?;
        if self.max_request_bytes < 1024 || self.max_event_bytes < 1024 {
            return Err("MAX_REQUEST_BYTES and MAX_EVENT_BYTES must be at least 1024".into());
        }
        if self.rate_limit_per_second > 0 && self.rate_limit_burst == 0 {
            return Err("RATE_LIMIT_BURST must be at least 1 while RATE_LIMIT_PER_SECOND is set".into());
        }
        Ok(())
    }
}

/// Everything `standalone` needs: the API's settings and how deliveries are
/// made; `DATA_DIR` (in the shared settings) says where everything is kept.
#[derive(Debug, Clone, Args)]
pub struct StandaloneConfig {
    #[command(flatten)]
    pub api: Config,

    #[command(flatten)]
    pub delivery: dispatcher::DeliveryConfig,
}

impl StandaloneConfig {
    /// Parses settings as `webhooks-api standalone` does (tests configure an
    /// instance with it).
    pub fn from_args<I, T>(args: I) -> Result<StandaloneConfig, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        shared::config::parse_args("webhooks-api", args)
    }

    /// Checks what clap's types cannot express.
    pub fn validate(&self) -> Result<(), String> {
        self.api.validate()?;
        self.delivery.validate()
    }
}
