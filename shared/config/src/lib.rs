//! Settings both programs read, from environment variables or flags of the same
//! meaning (API.md §7). Each binary flattens [`CommonConfig`] into its own typed
//! config, parsed and validated once at start. Also what every process sets
//! up the same way: its logs ([`telemetry`]) and its shutdown signal
//! ([`shutdown`]).

mod broker;
pub mod shutdown;
pub mod telemetry;

pub use broker::{BrokerAddress, BrokerAddresses};

use std::{fmt, path::PathBuf, str::FromStr, time::Duration};

use clap::{ArgAction, Args, ValueEnum};
use webhooks_model::{DEFAULT_RETRY_SCHEDULE, RetrySchedule, parse_duration};

/// Which kind of deployment this is; it decides the API key prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Environment {
    /// Keys are `sk-test-…`.
    Sandbox,
    /// Keys are `sk-live-…`.
    Production,
}

impl Environment {
    /// The key prefix of this environment, without the trailing dash.
    pub fn key_prefix(self) -> &'static str {
        match self {
            Environment::Sandbox => "sk-test",
            Environment::Production => "sk-live",
        }
    }
}

/// Log line format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// A secret setting: kept out of `Debug` output and logs.
#[derive(Clone, Default)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// Parses a program's settings struct from flags (`--database-url …`), falling
/// back to the environment and then the defaults, as the binaries do. Tests use
/// it to configure an instance without touching the process environment; the
/// first item is the program name.
pub fn parse_args<C, I, T>(program: &'static str, args: I) -> Result<C, clap::Error>
where
    C: Args + clap::FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = C::augment_args(clap::Command::new(program)).try_get_matches_from(args)?;
    C::from_arg_matches(&matches)
}

/// Settings shared by `webhooks-api` and `webhooks-dispatcher`. Its `Debug`
/// shows the connection strings with their passwords redacted, so a config
/// printed in a log or a panic gives no credential away.
#[derive(Clone, Args)]
pub struct CommonConfig {
    /// PostgreSQL connection string (default
    /// `postgres://postgres@127.0.0.1:5432/webhooks`).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,

    /// Where standalone mode keeps everything (its SQLite store). The
    /// operator's commands (`keys create`, `migrate`) work on it when it is
    /// set and `DATABASE_URL` is not.
    #[arg(long, env = "DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Upper bound of this process's PostgreSQL pool; keep the sum over all
    /// processes under the server's `max_connections` (100 by default).
    #[arg(long, env = "DATABASE_MAX_CONNECTIONS", default_value_t = 10)]
    pub database_max_connections: u32,

    /// How long one database statement may run before PostgreSQL cancels
    /// it: a request that would take longer answers 503 with `Retry-After`
    /// and frees its connection at once, instead of holding it while
    /// nobody waits for the answer. Dispatchers run without it.
    #[arg(long, env = "DATABASE_STATEMENT_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub database_statement_timeout: Duration,

    // Kept as written and parsed by `broker_addresses` (checked in
    // `validate`), so that a bad entry is reported redacted rather than
    // echoed whole, password included, by the argument parser.
    /// RabbitMQ: one `amqp://` or `amqps://` URL, or several of one cluster,
    /// comma-separated.
    #[arg(long, env = "AMQP_URL", default_value = "amqp://guest:guest@127.0.0.1:5672/%2f", hide_env_values = true)]
    pub amqp_url: String,

    /// Prefix of every exchange and queue name, so deployments can share a broker.
    #[arg(long, env = "QUEUE_PREFIX", default_value = "webhooks")]
    pub queue_prefix: String,

    /// `sandbox` (keys `sk-test-…`) or `production` (keys `sk-live-…`).
    #[arg(long, env = "PLATFORM_ENVIRONMENT", value_enum, default_value = "sandbox")]
    pub platform_environment: Environment,

    /// A PEM file of extra trusted root certificates, added to the system's.
    #[arg(long, env = "TLS_EXTRA_ROOTS")]
    pub tls_extra_roots: Option<PathBuf>,

    /// Allow endpoints on loopback, private and other non-public addresses.
    #[arg(long, env = "TARGET_ALLOW_PRIVATE", default_value_t = false, action = ArgAction::Set)]
    pub target_allow_private: bool,

    /// Total time allowed for one delivery attempt (and for the TLS check at
    /// endpoint registration).
    #[arg(long, env = "DELIVERY_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub delivery_timeout: Duration,

    /// Delay before each retry, comma-separated.
    #[arg(long, env = "RETRY_SCHEDULE", default_value = DEFAULT_RETRY_SCHEDULE)]
    pub retry_schedule: RetrySchedule,

    /// The keys that encrypt endpoint private keys at rest, comma-separated,
    /// each 32 bytes (base64 or 64 hex digits): the first seals, every one
    /// opens, so the key can change without an outage (docs/operations.md, "Rotating
    /// the key-encryption key").
    #[arg(long, env = "KEY_ENCRYPTION_KEY", hide_env_values = true)]
    pub key_encryption_key: Option<Secret>,

    /// `text` or `json` log lines on stderr.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// The clock of day-long decisions (endpoint health); tests move it.
    #[arg(skip)]
    pub clock: webhooks_model::time::Clock,

    /// For tests of the one clock: this host's clock is off by this much
    /// (`1h` ahead, `-1h` behind). The process still stamps the database's
    /// time (DESIGN.md, "One clock").
    #[arg(long, env = "FAULT_CLOCK_SKEW", hide = true, allow_hyphen_values = true, value_parser = parse_skew)]
    pub fault_clock_skew: Option<chrono::Duration>,
}

/// A duration with an optional sign: `-1h` is an hour behind.
fn parse_skew(raw: &str) -> Result<chrono::Duration, String> {
    let (sign, magnitude) = match raw.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, raw.strip_prefix('+').unwrap_or(raw)),
    };
    let duration = parse_duration(magnitude)?;
    chrono::Duration::from_std(duration).map(|d| d * sign).map_err(|e| e.to_string())
}

impl CommonConfig {
    /// Applies what a test asked of this process's host ([`Self::fault_clock_skew`]);
    /// a program calls it first thing.
    pub fn apply_faults(&self) {
        if let Some(skew) = self.fault_clock_skew {
            webhooks_model::time::skew_host_clock(skew);
        }
    }
}

impl fmt::Debug for CommonConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommonConfig")
            .field("database_url", &self.database_url.as_deref().map(redacted_url))
            .field("data_dir", &self.data_dir)
            .field("database_max_connections", &self.database_max_connections)
            .field("database_statement_timeout", &self.database_statement_timeout)
            .field("amqp_url", &self.broker_addresses().map_or_else(|_| "<invalid>".to_owned(), |a| a.to_string()))
            .field("queue_prefix", &self.queue_prefix)
            .field("platform_environment", &self.platform_environment)
            .field("tls_extra_roots", &self.tls_extra_roots)
            .field("target_allow_private", &self.target_allow_private)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("retry_schedule", &self.retry_schedule)
            .field("key_encryption_key", &self.key_encryption_key)
            .field("log_format", &self.log_format)
            .finish_non_exhaustive()
    }
}

/// Query parameters of a connection string whose values are secrets
/// (`password`, `sslpassword`, `token`, …), matched by substring.
const SECRET_PARAMETERS: [&str; 3] = ["pass", "secret", "token"];

/// `raw` with its password, and the values of query parameters that carry
/// secrets, replaced by `***`: the form of a connection string fit for
/// `Debug` output and logs. A string that does not parse as a URL is shown as
/// `<unparseable url>`, since where its secret sits is unknown.
pub fn redacted_url(raw: &str) -> String {
    let Ok(mut url) = url::Url::parse(raw) else { return "<unparseable url>".to_owned() };
    if url.password().is_some() {
        // Only fails for URLs that cannot have credentials, which have no password.
        let _ = url.set_password(Some("***"));
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let lower = name.to_ascii_lowercase();
                let secret = SECRET_PARAMETERS.iter().any(|s| lower.contains(s));
                (name.into_owned(), if secret { "***".to_owned() } else { value.into_owned() })
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

/// The PostgreSQL database used when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/webhooks";

/// Where standalone mode keeps its data when `DATA_DIR` is not set.
pub const DEFAULT_DATA_DIR: &str = "./webhooks-data";

impl CommonConfig {
    /// The PostgreSQL connection string in force.
    pub fn database_url(&self) -> &str {
        self.database_url.as_deref().unwrap_or(DEFAULT_DATABASE_URL)
    }

    /// The broker addresses of `AMQP_URL`; the error names the bad entry,
    /// redacted.
    pub fn broker_addresses(&self) -> Result<BrokerAddresses, String> {
        self.amqp_url.parse()
    }

    /// The standalone data directory in force.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
    }

    /// The cipher for endpoint private keys; a blank `KEY_ENCRYPTION_KEY`
    /// counts as unset.
    pub fn key_cipher(&self) -> Result<webhooks_keys::KeyCipher, webhooks_keys::KeyError> {
        webhooks_keys::KeyCipher::new(
            self.key_encryption_key.as_ref().map(Secret::expose).filter(|k| !k.trim().is_empty()),
        )
    }

    /// Whether a non-blank `KEY_ENCRYPTION_KEY` is set.
    pub fn has_key_encryption_key(&self) -> bool {
        self.key_encryption_key.as_ref().is_some_and(|k| !k.expose().trim().is_empty())
    }

    /// Checks what clap's types cannot express.
    pub fn validate(&self) -> Result<(), String> {
        // Production holds real customers' endpoint keys: refuse to keep them
        // in the clear rather than let a forgotten setting do it silently.
        if self.platform_environment == Environment::Production && !self.has_key_encryption_key() {
            return Err("PLATFORM_ENVIRONMENT=production needs KEY_ENCRYPTION_KEY (32 bytes, base64 or 64 hex \
                 digits): endpoint private keys are not stored in the clear in production"
                .into());
        }
        self.key_cipher().map_err(|error| error.to_string())?;
        let prefix = &self.queue_prefix;
        if prefix.is_empty()
            || prefix.len() > 200
            || !prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(format!(
                "QUEUE_PREFIX must be 1-200 characters of letters, digits, '.', '_' or '-', got {prefix:?}"
            ));
        }
        self.broker_addresses()?;
        if self.database_max_connections == 0 {
            return Err("DATABASE_MAX_CONNECTIONS must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(args: &[&str]) -> CommonConfig {
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            common: CommonConfig,
        }
        let cli: Cli = clap::Parser::try_parse_from(std::iter::once("test").chain(args.iter().copied())).unwrap();
        cli.common
    }

    #[test]
    fn connection_string_passwords_stay_out_of_debug() {
        let config = common(&[
            "--database-url",
            "postgres://webhooks:pg-hunter2@db.internal:5432/webhooks?sslmode=require&sslpassword=tls-hunter2",
            "--amqp-url",
            "amqps://relay:mq-hunter2@mq.internal:5671/%2f",
            "--key-encryption-key",
            "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=",
        ]);
        let debug = format!("{config:?}");
        for secret in ["pg-hunter2", "tls-hunter2", "mq-hunter2", "q83vEjRWeJ"] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
        }
        // What an operator needs to tell the settings apart stays.
        for kept in ["webhooks:***@db.internal:5432/webhooks", "sslmode=require", "relay:***@mq.internal:5671"] {
            assert!(debug.contains(kept), "{kept} not in {debug}");
        }
        assert_eq!(redacted_url("amqp://guest@127.0.0.1:5672/%2f"), "amqp://guest@127.0.0.1:5672/%2f");
        assert_eq!(redacted_url("host=db password=pg-hunter2"), "<unparseable url>");
    }

    #[test]
    fn a_broker_list_is_checked_at_start_and_stays_redacted() {
        let list = "amqp://relay:mq-hunter2@mq1:5672/%2f,amqp://relay:mq-hunter2@mq2:5672/%2f";
        let config = common(&["--amqp-url", list]);
        config.validate().unwrap();
        assert_eq!(config.broker_addresses().unwrap().len(), 2);
        let debug = format!("{config:?}");
        assert!(!debug.contains("mq-hunter2") && debug.contains("relay:***@mq2:5672"), "{debug}");
        let bad = common(&["--amqp-url", "amqp://relay:mq-hunter2@mq1:5672/%2f,mq2:5672"]);
        let message = bad.validate().unwrap_err();
        assert!(
            message.contains("AMQP_URL entry 1 of 1") && message.contains("comma") && !message.contains("mq-hunter2"),
            "{message}"
        );
        assert!(!format!("{bad:?}").contains("mq-hunter2"));
    }

    #[test]
    fn production_needs_a_key_encryption_key() {
        let message = common(&["--platform-environment", "production"]).validate().unwrap_err();
        assert!(message.contains("KEY_ENCRYPTION_KEY") && message.contains("production"), "{message}");
        let blank = common(&["--platform-environment", "production", "--key-encryption-key", "  "]);
        assert!(blank.validate().is_err(), "a blank key counts as none");
        let kek = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";
        common(&["--platform-environment", "production", "--key-encryption-key", kek]).validate().unwrap();
        common(&[]).validate().unwrap();
        let short = common(&["--key-encryption-key", "c2hvcnQ="]).validate().unwrap_err();
        assert!(short.contains("KEY_ENCRYPTION_KEY"), "{short}");
    }

    #[test]
    fn a_key_list_seals_with_its_first_key_and_a_bad_entry_is_named_by_position() {
        let (new, old) =
            ("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=");
        let listed = common(&["--key-encryption-key", &format!("{new},{old}")]);
        listed.validate().unwrap();
        let cipher = listed.key_cipher().unwrap();
        assert_eq!(cipher.key_ids().count(), 2);
        assert_eq!(cipher.sealing_key().map(|id| id.to_string()).as_deref(), Some("630dcd2966c43366"));
        let debug = format!("{listed:?} {cipher:?}");
        for secret in [&new[..20], &old[..20]] {
            assert!(!debug.contains(secret), "{debug}");
        }
        let bad = common(&["--key-encryption-key", &format!("{new},{}", &old[..30])]).validate().unwrap_err();
        assert!(bad.contains("KEY_ENCRYPTION_KEY entry 2 of 2"), "{bad}");
        assert!(!bad.contains(&old[..30]) && !bad.contains(new), "{bad}");
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let secret: Secret = "hunter2".parse().unwrap();
        assert!(!format!("{secret:?}").contains("hunter2"));
    }
}
