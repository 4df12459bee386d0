//! `webhooks-api serve` settings: the shared ones plus the API's own.

use std::{net::SocketAddr, time::Duration};

use clap::Args;
use webhooks_config::{CommonConfig, Secret};
use webhooks_model::parse_duration;

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

    /// When set (and not blank), `/internal/events` and `/metrics` require
    /// `Authorization: Bearer <token>`; required unless the internal listener
    /// is on a loopback address.
    #[arg(long, env = "INTERNAL_TOKEN", hide_env_values = true)]
    pub internal_token: Option<Secret>,

    #[command(flatten)]
    pub limits: webhooks_listener::Limits,

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

    /// Events per second per developer whose deliveries wait in the default
    /// work queue; beyond it (and beyond `FAIR_SHARE_BURST`) they wait in the
    /// bulk queue, which may take at most three quarters of a dispatcher, so
    /// one developer's backlog never delays the others. 0 sends everything to
    /// the default queue.
    #[arg(long, env = "FAIR_SHARE_PER_SECOND", default_value_t = 100)]
    pub fair_share_per_second: u32,

    /// Events a developer may send at once above the fair share and still
    /// have them in the default queue.
    #[arg(long, env = "FAIR_SHARE_BURST", default_value_t = 200)]
    pub fair_share_burst: u32,

    /// How long events, their deliveries and delivery logs are kept; older
    /// ones are deleted in small batches (see [`Config::retention`]). `0`
    /// keeps everything.
    #[arg(long, env = "RETENTION", default_value = "30d", value_parser = parse_retention)]
    pub retention: Duration,

    /// How often a retention sweep starts (the first one at start); a sweep
    /// deletes batch after batch until nothing older is left.
    #[arg(long, env = "RETENTION_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub retention_interval: Duration,

    /// Distributed mode: a delivery that is due but that no queue holds is
    /// queued again within two of these; also how often the stalled turns of
    /// ordered endpoints are walked and the queue's gauges refreshed.
    #[arg(long, env = "SWEEP_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub sweep_interval: Duration,

    /// Deliveries a recovery queues per transaction at most (it reads at
    /// most ten events for each); each batch is followed by a pause at least
    /// as long, so recoveries never starve ingest. Small batches reach the
    /// dispatchers as a trickle that live traffic does not wait behind.
    #[arg(long, env = "RECOVERY_BATCH", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub recovery_batch: u32,

    /// Deliveries recoveries may queue per second, in all, per API process
    /// (0: as fast as the batches go). Recovered events are delivered
    /// beside live traffic; this keeps them from taking the capacity it needs.
    #[arg(long, env = "RECOVERY_RATE", default_value_t = 500)]
    pub recovery_rate: u32,

    /// Faults a test injects; all off otherwise.
    #[arg(skip)]
    pub faults: webhooks_queue::Faults,

    /// For tests of what a process killed between an ingest's commit and
    /// the broker's confirm leaves behind: this process publishes no first
    /// attempt (DESIGN.md, "Knowing what is stranded").
    #[arg(long, env = "FAULT_LOSE_FIRST_ATTEMPTS", hide = true, default_value_t = false, action = clap::ArgAction::Set)]
    pub fault_lose_first_attempts: bool,

    /// Distributed mode: deliveries (or ordered endpoints) the sweeper
    /// handles per statement.
    #[arg(long, env = "SWEEP_BATCH", default_value_t = 500, value_parser = clap::value_parser!(u16).range(1..))]
    pub sweep_batch: u16,

    /// How long a replaced key keeps signing beside the new one after a
    /// rotation or a scheme change (both signatures in every delivery); then
    /// its private half is deleted.
    #[arg(long, env = "KEY_ROTATION_OVERLAP", default_value = "24h", value_parser = parse_duration)]
    pub key_rotation_overlap: Duration,

    /// An active endpoint whose attempts have all failed for this long, on at
    /// least three different days, is disabled by the service
    /// (`disabled_reason: failing`). `0` switches it off.
    #[arg(long, env = "AUTO_DISABLE_AFTER", default_value = "5d", value_parser = parse_retention)]
    pub auto_disable_after: Duration,

    /// Origins allowed to embed the dashboard in a frame (`https://console.example.com`,
    /// separated by commas or spaces). Unset: no page may frame it.
    #[arg(long, env = "PORTAL_FRAME_ANCESTORS", value_parser = parse_frame_ancestors)]
    pub portal_frame_ancestors: Option<FrameAncestors>,

    /// The dashboard's title, in its header and its tab (at most 60
    /// characters). Unset: `Webhooks`.
    #[arg(long, env = "PORTAL_TITLE", value_parser = parse_portal_title)]
    pub portal_title: Option<String>,

    /// The dashboard's accent colour: a CSS hex colour (`#1a7f5a`, `#fa0`).
    #[arg(long, env = "PORTAL_ACCENT_COLOR", value_parser = parse_accent_color)]
    pub portal_accent_color: Option<String>,

    /// A JSON file of event types (`{"event_types": [...]}`, each as `PUT
    /// /internal/event_types/{name}` takes it, with its `name`), stored at
    /// start: it adds and replaces the types it names. Unset: the default
    /// catalog shipped with the service.
    #[arg(long, env = "EVENT_CATALOG")]
    pub event_catalog: Option<std::path::PathBuf>,

    /// Whether ingest refuses an `event_type` the catalog does not know;
    /// `false` accepts it (logged and counted).
    #[arg(long, env = "EVENT_CATALOG_STRICT", default_value_t = true, action = clap::ArgAction::Set)]
    pub event_catalog_strict: bool,
}

/// The origins of `PORTAL_FRAME_ANCESTORS`, each checked to be a bare origin,
/// so the list goes into the CSP header as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameAncestors(pub Vec<String>);

fn parse_frame_ancestors(value: &str) -> Result<FrameAncestors, String> {
    let origins: Vec<String> =
        value.split([',', ' ']).map(str::trim).filter(|o| !o.is_empty()).map(str::to_owned).collect();
    if origins.is_empty() {
        return Err("PORTAL_FRAME_ANCESTORS lists no origin".into());
    }
    for origin in &origins {
        let host = origin.strip_prefix("https://").or_else(|| origin.strip_prefix("http://"));
        let bare = host.is_some_and(|host| {
            !host.is_empty()
                && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:*[]".contains(&b))
                && !host.starts_with(':')
        });
        if !bare {
            return Err(format!(
                "PORTAL_FRAME_ANCESTORS: {origin:?} is not an origin (https://host or https://host:port, no path)"
            ));
        }
    }
    Ok(FrameAncestors(origins))
}

fn parse_portal_title(value: &str) -> Result<String, String> {
    let title = value.trim();
    if title.is_empty() || title.chars().count() > 60 || title.chars().any(char::is_control) {
        return Err("PORTAL_TITLE must be 1 to 60 characters, without control characters".into());
    }
    Ok(title.to_owned())
}

fn parse_accent_color(value: &str) -> Result<String, String> {
    let colour = value.trim();
    let valid = colour
        .strip_prefix('#')
        .is_some_and(|hex| [3, 4, 6, 8].contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if !valid {
        return Err(format!(
            "PORTAL_ACCENT_COLOR {colour:?} is not a CSS hex colour (#rgb, #rgba, #rrggbb, #rrggbbaa)"
        ));
    }
    Ok(colour.to_ascii_lowercase())
}

/// The shortest `SWEEP_INTERVAL`: dispatchers send first attempts younger
/// than this without checking their delivery (the hot path), so a sweep must
/// never re-arm a delivery that recent.
pub const MIN_SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// Parses `RETENTION`: a duration as [`parse_duration`] reads it, or `0`,
/// which switches retention off (`parse_duration` refuses zero, which for
/// every other setting is a mistake).
fn parse_retention(value: &str) -> Result<Duration, String> {
    match value.trim() {
        "0" => Ok(Duration::ZERO),
        value => parse_duration(value).map_err(|error| format!("{error} (use 0 to keep everything)")),
    }
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
        webhooks_config::parse_args("webhooks-api", args)
    }

    /// How long events, deliveries and logs are kept, or `None` when
    /// `RETENTION=0` keeps them for ever.
    pub fn retention(&self) -> Option<Duration> {
        Some(self.retention).filter(|retention| !retention.is_zero())
    }

    /// The internal bearer token in force: `INTERNAL_TOKEN` unless it is
    /// blank, which counts as unset (an empty bearer never authenticates).
    pub fn internal_token(&self) -> Option<&str> {
        self.internal_token.as_ref().map(Secret::expose).filter(|token| !token.trim().is_empty())
    }

    /// Refuses an internal listener on `addr` that anyone on the network could
    /// reach without a token: it takes events for every developer.
    pub fn check_internal_exposure(&self, addr: SocketAddr) -> Result<(), String> {
        webhooks_listener::check_exposure("INTERNAL_LISTEN_ADDR", addr, self.internal_token())
    }

    /// Checks what clap's types cannot express.
    pub fn validate(&self) -> Result<(), String> {
        self.common.validate()?;
        self.check_internal_exposure(self.internal_listen_addr)?;
        if self.limits.max_connections == 0 {
            return Err("MAX_CONNECTIONS must be at least 1".into());
        }
        if self.limits.request_timeout <= self.common.delivery_timeout {
            return Err(format!(
                "REQUEST_TIMEOUT ({:?}) must be longer than DELIVERY_TIMEOUT ({:?}): registering an endpoint checks \
                 its url within DELIVERY_TIMEOUT",
                self.limits.request_timeout, self.common.delivery_timeout
            ));
        }
        if self.max_request_bytes < 1024 || self.max_event_bytes < 1024 {
            return Err("MAX_REQUEST_BYTES and MAX_EVENT_BYTES must be at least 1024".into());
        }
        if self.rate_limit_per_second > 0 && self.rate_limit_burst == 0 {
            return Err("RATE_LIMIT_BURST must be at least 1 while RATE_LIMIT_PER_SECOND is set".into());
        }
        // A recovery's lease lapses unless its next batch comes in time.
        let pause = Duration::from_secs_f64(f64::from(self.recovery_batch) / f64::from(self.recovery_rate.max(1)));
        if self.recovery_rate > 0 && pause > crate::recoveries::MAX_PAUSE {
            return Err(format!(
                "RECOVERY_RATE ({}) must be at least RECOVERY_BATCH ({}) per {:?}: a recovery waits \
                 RECOVERY_BATCH / RECOVERY_RATE after each batch, and a longer wait lets its lease lapse",
                self.recovery_rate,
                self.recovery_batch,
                crate::recoveries::MAX_PAUSE
            ));
        }
        // Two intervals must hold an attempt in flight and a sweep period,
        // and lie past the age below which a dispatcher trusts a first
        // attempt without reading its delivery.
        if self.sweep_interval < MIN_SWEEP_INTERVAL
            || self.sweep_interval < self.common.delivery_timeout + Duration::from_secs(5)
        {
            return Err(format!(
                "SWEEP_INTERVAL ({:?}) must be at least {MIN_SWEEP_INTERVAL:?} and at least 5s longer than \
                 DELIVERY_TIMEOUT ({:?})",
                self.sweep_interval, self.common.delivery_timeout
            ));
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
        webhooks_config::parse_args("webhooks-api", args)
    }

    /// Checks what clap's types cannot express.
    pub fn validate(&self) -> Result<(), String> {
        self.api.validate()?;
        self.delivery.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Config {
        Config::from_args(std::iter::once("webhooks-api").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn an_exposed_internal_listener_needs_a_token() {
        config(&[]).validate().unwrap();
        let exposed = config(&["--internal-listen-addr", "0.0.0.0:8081"]).validate().unwrap_err();
        assert!(exposed.contains("INTERNAL_LISTEN_ADDR") && exposed.contains("INTERNAL_TOKEN"), "{exposed}");
        for blank in ["", "   "] {
            let config = config(&["--internal-listen-addr", "10.0.0.5:8081", "--internal-token", blank]);
            assert!(config.validate().is_err(), "a blank token {blank:?} counts as none");
            assert_eq!(config.internal_token(), None);
        }
        config(&["--internal-listen-addr", "0.0.0.0:8081", "--internal-token", "s3cret"]).validate().unwrap();
        config(&["--internal-listen-addr", "[::1]:8081"]).validate().unwrap();
        config(&["--internal-listen-addr", "[::ffff:127.0.0.1]:8081"]).validate().unwrap();
        assert!(config(&["--internal-listen-addr", "[::]:8081"]).validate().is_err());
    }

    #[test]
    fn a_recovery_rate_too_low_for_its_batch_is_refused() {
        config(&["--recovery-rate", "0"]).validate().unwrap();
        config(&["--recovery-batch", "100", "--recovery-rate", "10"]).validate().unwrap();
        let slow = config(&["--recovery-batch", "100", "--recovery-rate", "2"]).validate().unwrap_err();
        assert!(slow.contains("RECOVERY_RATE") && slow.contains("RECOVERY_BATCH"), "{slow}");
    }

    #[test]
    fn portal_settings_are_checked() {
        let parsed = |args: &[&str]| Config::from_args(std::iter::once("webhooks-api").chain(args.iter().copied()));
        let branded = config(&[
            "--portal-frame-ancestors",
            "https://console.example.com, http://localhost:3000",
            "--portal-title",
            " Acme ",
            "--portal-accent-color",
            "#1A7F5A",
        ]);
        assert_eq!(
            branded.portal_frame_ancestors,
            Some(FrameAncestors(vec!["https://console.example.com".into(), "http://localhost:3000".into()]))
        );
        assert_eq!(branded.portal_title.as_deref(), Some("Acme"));
        assert_eq!(branded.portal_accent_color.as_deref(), Some("#1a7f5a"));
        for bad in ["https://a.example/path", "a.example", "https://a.example; script-src *", "'none'", "https://"] {
            assert!(parsed(&["--portal-frame-ancestors", bad]).is_err(), "{bad}");
        }
        for bad in ["1a7f5a", "#12345", "#ggg", "red", "#fff;}", ""] {
            assert!(parsed(&["--portal-accent-color", bad]).is_err(), "{bad}");
        }
        assert!(parsed(&["--portal-title", &"t".repeat(61)]).is_err());
        assert!(parsed(&["--portal-title", "a\nb"]).is_err(), "no control characters");
    }

    #[test]
    fn listener_limits_are_checked() {
        assert!(config(&["--max-connections", "0"]).validate().is_err());
        let short = config(&["--request-timeout", "5s", "--delivery-timeout", "10s"]).validate().unwrap_err();
        assert!(short.contains("REQUEST_TIMEOUT") && short.contains("DELIVERY_TIMEOUT"), "{short}");
        let config = config(&[]);
        assert_eq!(config.limits.header_read_timeout, Duration::from_secs(10));
        assert_eq!(config.limits.request_timeout, Duration::from_secs(30));
        assert_eq!(config.limits.max_connections, 1024);
    }

    #[test]
    fn retention_defaults_to_thirty_days_and_zero_switches_it_off() {
        assert_eq!(config(&[]).retention(), Some(Duration::from_secs(30 * 24 * 3600)));
        assert_eq!(config(&[]).retention_interval, Duration::from_secs(600));
        assert_eq!(config(&["--retention", "12h"]).retention(), Some(Duration::from_secs(12 * 3600)));
        assert_eq!(
            config(&["--retention", "2s", "--retention-interval", "500ms"]).retention(),
            Some(Duration::from_secs(2))
        );
        assert_eq!(config(&["--retention", "0"]).retention(), None);
        let args = |args: &[&str]| Config::from_args(std::iter::once("webhooks-api").chain(args.iter().copied()));
        assert!(args(&["--retention", "soon"]).is_err());
        assert!(args(&["--retention-interval", "0"]).is_err(), "a sweep every instant is a mistake");
    }

    #[test]
    fn secrets_stay_out_of_the_debug_of_the_config() {
        let config = config(&[
            "--internal-token",
            "internal-hunter2",
            "--amqp-url",
            "amqp://relay:mq-hunter2@mq.internal:5672/%2f",
            "--database-url",
            "postgres://api:pg-hunter2@db.internal/webhooks",
        ]);
        let debug = format!("{config:?}");
        for secret in ["internal-hunter2", "mq-hunter2", "pg-hunter2"] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
        }
    }
}
