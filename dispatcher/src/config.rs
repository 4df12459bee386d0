//! `webhooks-dispatcher` settings: the shared ones plus the worker's own.

use std::{net::SocketAddr, time::Duration};

use clap::Args;
use webhooks_config::{CommonConfig, Secret};
use webhooks_model::parse_duration;

/// Everything a dispatcher needs, loaded once and validated at start.
#[derive(Debug, Clone, Args)]
pub struct Config {
    #[command(flatten)]
    pub common: CommonConfig,

    /// Where `/healthz`, `/readyz` and `/metrics` listen.
    #[arg(long, env = "DISPATCHER_LISTEN_ADDR", default_value = "127.0.0.1:8082")]
    pub dispatcher_listen_addr: SocketAddr,

    /// When set (and not blank), `/metrics` requires `Authorization: Bearer
    /// <token>`; required unless `DISPATCHER_LISTEN_ADDR` is a loopback
    /// address. The probes `/healthz` and `/readyz` stay open.
    #[arg(long, env = "INTERNAL_TOKEN", hide_env_values = true)]
    pub internal_token: Option<Secret>,

    #[command(flatten)]
    pub limits: webhooks_listener::Limits,

    #[command(flatten)]
    pub delivery: DeliveryConfig,
}

/// How deliveries are made, in a dispatcher and in standalone mode alike.
#[derive(Debug, Clone, Args)]
pub struct DeliveryConfig {
    /// Unacknowledged messages the broker hands this dispatcher at once.
    #[arg(long, env = "DISPATCHER_PREFETCH", default_value_t = 256)]
    pub dispatcher_prefetch: u16,

    /// Delivery attempts in flight at once.
    #[arg(long, env = "DISPATCHER_CONCURRENCY", default_value_t = 256)]
    pub dispatcher_concurrency: usize,

    /// Attempts in flight at once to one endpoint; past it, messages for that
    /// endpoint are deferred so a slow endpoint cannot take every slot.
    #[arg(long, env = "DISPATCHER_ENDPOINT_CONCURRENCY", default_value_t = 32)]
    pub dispatcher_endpoint_concurrency: usize,

    /// How long a message waits for a slot at its endpoint before it is parked
    /// in the shortest retry queue.
    #[arg(long, env = "ENDPOINT_SLOT_WAIT", default_value = "1s", value_parser = parse_duration)]
    pub endpoint_slot_wait: Duration,

    /// How long a stopping dispatcher may finish what it holds before handing
    /// the rest back to the broker.
    #[arg(long, env = "SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// How long an endpoint stays cached without a lifecycle message (a safety
    /// net; lifecycle messages invalidate at once).
    #[arg(long, env = "ENDPOINT_CACHE_TTL", default_value = "60s", value_parser = parse_duration)]
    pub endpoint_cache_ttl: Duration,

    /// Longest `Retry-After` honoured; longer asks are cut to this.
    #[arg(long, env = "MAX_RETRY_AFTER", default_value = "1h", value_parser = parse_duration)]
    pub max_retry_after: Duration,
}

impl Config {
    /// Parses settings from flags, falling back to the environment and then
    /// the defaults. Tests use this to configure an instance.
    pub fn from_args<I, T>(args: I) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        webhooks_config::parse_args("webhooks-dispatcher", args)
    }

    /// Checks what clap's types cannot express (among them, through the
    /// shared settings, that production has a `KEY_ENCRYPTION_KEY`).
    pub fn validate(&self) -> Result<(), String> {
        self.common.validate()?;
        if self.limits.max_connections == 0 {
            return Err("MAX_CONNECTIONS must be at least 1".into());
        }
        self.delivery.validate()
    }

    /// The token `/metrics` needs: `INTERNAL_TOKEN` unless blank.
    pub fn internal_token(&self) -> Option<&str> {
        self.internal_token.as_ref().map(Secret::expose).filter(|token| !token.trim().is_empty())
    }
}

impl DeliveryConfig {
    /// Checks what clap's types cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.dispatcher_prefetch == 0
            || self.dispatcher_concurrency == 0
            || self.dispatcher_endpoint_concurrency == 0
        {
            return Err(
                "DISPATCHER_PREFETCH, DISPATCHER_CONCURRENCY and DISPATCHER_ENDPOINT_CONCURRENCY must be at least 1"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_production_dispatcher_needs_a_key_encryption_key() {
        let config = |args: &[&str]| {
            Config::from_args(std::iter::once("webhooks-dispatcher").chain(args.iter().copied())).unwrap()
        };
        let refused = config(&["--platform-environment", "production"]).validate().unwrap_err();
        assert!(refused.contains("KEY_ENCRYPTION_KEY"), "{refused}");
        let kek = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";
        config(&["--platform-environment", "production", "--key-encryption-key", kek]).validate().unwrap();
        config(&[]).validate().unwrap();
    }
}
