//! The commands a developer or an operator reaches for by hand, besides
//! serving: `events send` (hand an event to a running service, for testing)
//! and `endpoints list|logs` (what a developer's endpoints are and how their
//! deliveries went, read from the store). Output is for people by default and
//! JSON with `--json`.

use std::{fmt::Write as _, io::Read as _, path::Path};

use anyhow::Context;
use uuid::Uuid;
use webhooks_config::CommonConfig;
use webhooks_model::DeliveryLog;
use webhooks_net::tls;
use webhooks_store::EndpointRecord;

/// Where `events send` posts: the internal listener of a running service.
pub struct SendTarget<'a> {
    /// `http://HOST:PORT` of the internal listener.
    pub internal_url: &'a str,
    /// `INTERNAL_TOKEN`, when the service runs with one.
    pub token: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
}

impl std::fmt::Debug for SendTarget<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendTarget")
            .field("internal_url", &self.internal_url)
            .field("token", &self.token.map(|_| "***"))
            .field("idempotency_key", &self.idempotency_key)
            .finish()
    }
}

/// Reads an ingest body from `source` (a file, or `-` for stdin).
pub fn read_body(source: &Path) -> anyhow::Result<Vec<u8>> {
    if source == Path::new("-") {
        let mut body = Vec::new();
        std::io::stdin().read_to_end(&mut body).context("read the event from stdin")?;
        Ok(body)
    } else {
        std::fs::read(source).with_context(|| format!("read {}", source.display()))
    }
}

/// Posts `body` to `POST /internal/events`; returns the accepted event, or
/// the service's refusal (its status and message) as the error.
pub async fn send_event(target: &SendTarget<'_>, body: Vec<u8>) -> anyhow::Result<serde_json::Value> {
    let tls = tls::client_config(tls::root_store(None)?)?;
    let client = reqwest::Client::builder().use_preconfigured_tls(tls).build().context("HTTP client")?;
    let url = format!("{}/internal/events", target.internal_url.trim_end_matches('/'));
    let body_len = body.len();
    let mut request = client.post(&url).header("Content-Type", "application/json").body(body);
    if let Some(token) = target.token {
        request = request.bearer_auth(token);
    }
    if let Some(key) = target.idempotency_key {
        request = request.header("Idempotency-Key", key);
    }
    let size = body_len;
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) if error.is_connect() => {
            return Err(error).with_context(|| {
                format!("cannot reach the internal listener at {url}: is the service running (serve or standalone)?")
            });
        }
        // Reached, then cut off while sending: the service answers an
        // event over its limit at once and closes the connection.
        Err(error) => {
            return Err(error).with_context(|| {
                format!(
                    "the service at {url} closed the connection while the event ({size} bytes) was being sent; an \
                     event over its MAX_EVENT_BYTES (256 KiB by default) is refused that way"
                )
            });
        }
    };
    let status = response.status();
    let text = response.text().await.context("read the service's answer")?;
    let answer: Option<serde_json::Value> = serde_json::from_str(&text).ok();
    if !status.is_success() {
        let message = answer.as_ref().and_then(|a| a["message"].as_str()).unwrap_or(text.trim());
        anyhow::bail!("the service refused the event: {status}: {message}");
    }
    answer.context("the service's answer is not JSON")
}

/// One line for an accepted event.
pub fn render_sent(event: &serde_json::Value) -> String {
    format!(
        "accepted {} (sequence {}, {}) for developer {}\n",
        event["event_id"].as_str().unwrap_or("?"),
        event["event_sequence"],
        event["event_type"].as_str().unwrap_or("?"),
        event["event_developer_id"].as_str().unwrap_or("?"),
    )
}

/// A developer's endpoints, newest first.
pub async fn list_endpoints(common: &CommonConfig, developer_id: Uuid) -> anyhow::Result<Vec<EndpointRecord>> {
    let (store, _) = webhooks_store::open::for_command(common).await?;
    Ok(store.list_endpoints(developer_id).await?)
}

/// The endpoints as a table for people, or as the API's `Webhook` objects.
pub fn render_endpoints(endpoints: &[EndpointRecord], json: bool) -> anyhow::Result<String> {
    if json {
        let webhooks: Vec<_> = endpoints.iter().map(EndpointRecord::to_webhook).collect();
        return Ok(format!("{}\n", serde_json::to_string(&webhooks)?));
    }
    if endpoints.is_empty() {
        return Ok("no endpoints\n".to_owned());
    }
    let mut out = String::new();
    for endpoint in endpoints {
        let health = match (&endpoint.health.failing_since, &endpoint.health.last_success_at) {
            (Some(since), _) => format!("failing since {}", webhooks_model::time::format(since)),
            (None, Some(at)) => format!("last success {}", webhooks_model::time::format(at)),
            (None, None) => "no deliveries yet".to_owned(),
        };
        let reason = endpoint.disabled_reason.map(|_| " (by the service: failing)").unwrap_or_default();
        let _ = writeln!(
            out,
            "{}  {}{}  {}  {}  {}",
            endpoint.id,
            endpoint.status.as_str(),
            reason,
            endpoint.signature_scheme.as_str(),
            endpoint.url,
            health
        );
    }
    Ok(out)
}

/// API keys as lines for people (developer, key id, the key's visible
/// part, scopes, name, created), or as JSON `ApiKey` objects.
pub fn render_keys(keys: &[webhooks_model::ApiKey], json: bool) -> anyhow::Result<String> {
    if json {
        return Ok(format!("{}\n", serde_json::to_string(keys)?));
    }
    if keys.is_empty() {
        return Ok("no keys\n".to_owned());
    }
    let mut out = String::new();
    for key in keys {
        let scopes: Vec<&str> = key.scopes.iter().map(|scope| scope.as_str()).collect();
        let _ = writeln!(
            out,
            "developer {}  key {}  {}-…{}  {}  {}  created {}",
            key.owner_id,
            key.id,
            key.prefix,
            key.last_4,
            scopes.join(","),
            key.name.as_deref().unwrap_or("(no name)"),
            webhooks_model::time::format(&key.created_at)
        );
    }
    Ok(out)
}

/// An endpoint's newest `limit` log entries, if the endpoint exists.
pub async fn endpoint_logs(common: &CommonConfig, endpoint_id: &str, limit: i64) -> anyhow::Result<Vec<DeliveryLog>> {
    let (store, _) = webhooks_store::open::for_command(common).await?;
    store.load_endpoint(endpoint_id).await?.with_context(|| format!("no endpoint {endpoint_id}"))?;
    Ok(store.list_logs(endpoint_id, limit, None, &webhooks_store::LogFilter::default()).await?.unwrap_or_default())
}

/// The log entries as lines for people, or as the API's `DeliveryLog` objects.
pub fn render_logs(logs: &[DeliveryLog], json: bool) -> anyhow::Result<String> {
    if json {
        return Ok(format!("{}\n", serde_json::to_string(logs)?));
    }
    if logs.is_empty() {
        return Ok("no delivery attempts\n".to_owned());
    }
    let mut out = String::new();
    for log in logs {
        let outcome = match (log.status, &log.error) {
            (_, Some(error)) => format!("{} {error}", log.status.map_or("---".to_owned(), |s| s.to_string())),
            (Some(status), None) => status.to_string(),
            (None, None) => "---".to_owned(),
        };
        let _ = writeln!(
            out,
            "{}  {}  attempt {}  {}  {} ms",
            webhooks_model::time::format(&log.created_at),
            log.event_id,
            log.attempt,
            outcome,
            log.duration_ms
        );
    }
    Ok(out)
}
