//! `AMQP_URL`: the addresses of one RabbitMQ cluster (API.md 8.11).

use std::fmt;

/// Query parameters lapin reads as integers: a bad value is refused at start
/// rather than at the first connection.
const INTEGER_PARAMETERS: [&str; 4] = ["frame_max", "channel_max", "heartbeat", "connection_timeout"];

/// One broker address: the URL to connect with, and its redacted form, the
/// only one that may be shown. `Debug` and `Display` show the redacted form.
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerAddress {
    url: String,
    redacted: String,
}

impl BrokerAddress {
    /// The URL with its password, for the one place that connects.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// The URL with its password and secret parameters replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The host: a name, or an IP address (an IPv6 one without brackets).
    pub fn host(&self) -> String {
        let url = url::Url::parse(&self.url).ok();
        let host = url.as_ref().and_then(url::Url::host_str).unwrap_or_default();
        host.trim_start_matches('[').trim_end_matches(']').to_owned()
    }

    /// The port, the scheme's default (5672, or 5671 for amqps) when none is
    /// written.
    pub fn port(&self) -> u16 {
        let url = url::Url::parse(&self.url).ok();
        let tls = url.as_ref().is_some_and(|u| u.scheme() == "amqps");
        url.and_then(|u| u.port()).unwrap_or(if tls { 5671 } else { 5672 })
    }

    /// The host and port, as `host:port`.
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.host(), self.port())
    }
}

impl fmt::Debug for BrokerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Display for BrokerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// The addresses of one RabbitMQ cluster, in the order given: `AMQP_URL`,
/// comma-separated full `amqp://` or `amqps://` URLs. Never empty.
///
/// Parsing is strict ([`str::parse`]): an entry that is blank, not a URL, of
/// another scheme, without a host, or with a non-integer `heartbeat`,
/// `frame_max`, `channel_max` or `connection_timeout` is refused, named by
/// its position and shown redacted. No form of this type shows a password.
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerAddresses {
    addresses: Vec<BrokerAddress>,
}

impl BrokerAddresses {
    /// The addresses, in the order given.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &BrokerAddress> {
        self.addresses.iter()
    }

    /// How many addresses there are (at least one).
    pub fn len(&self) -> usize {
        self.addresses.len()
    }

    /// Always false: a list holds at least one address.
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }

    /// The address at `index` modulo the length.
    pub fn get(&self, index: usize) -> &BrokerAddress {
        &self.addresses[index % self.addresses.len()]
    }
}

impl std::str::FromStr for BrokerAddresses {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let entries = split_entries(raw);
        let count = entries.len();
        let mut addresses = Vec::with_capacity(count);
        for (index, entry) in entries.into_iter().enumerate() {
            let position = index + 1;
            let address = parse_address(entry).map_err(|problem| {
                let shown = if entry.is_empty() { "<blank>".to_owned() } else { redacted_entry(entry) };
                format!("AMQP_URL entry {position} of {count} ({shown}): {problem}")
            })?;
            if addresses.contains(&address) {
                return Err(format!("AMQP_URL entry {position} of {count} ({address}) is listed twice"));
            }
            addresses.push(address);
        }
        Ok(BrokerAddresses { addresses })
    }
}

/// The entries of a list: split at each comma that a URL follows (a
/// scheme and `://`), or a blank entry, so a comma inside a password stays
/// in its URL. Anything else after a comma stays in the entry before it,
/// whose vhost then holds a comma, which [`parse_address`] refuses.
fn split_entries(raw: &str) -> Vec<&str> {
    let starts_entry = |rest: &str| {
        let rest = rest.trim_start();
        let scheme = rest.split_once("://").map(|(scheme, _)| scheme);
        rest.is_empty()
            || rest.starts_with(',')
            || scheme.is_some_and(|scheme| {
                scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                    && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
            })
    };
    let mut entries = Vec::new();
    let mut start = 0;
    for (at, _) in raw.match_indices(',') {
        if at >= start && starts_entry(&raw[at + 1..]) {
            entries.push(raw[start..at].trim());
            start = at + 1;
        }
    }
    entries.push(raw[start..].trim());
    entries
}

fn parse_address(entry: &str) -> Result<BrokerAddress, String> {
    if entry.is_empty() {
        return Err("blank; give full amqp:// or amqps:// URLs separated by commas".into());
    }
    let url = url::Url::parse(entry).map_err(|error| format!("not a URL ({error})"))?;
    if !matches!(url.scheme(), "amqp" | "amqps") {
        return Err(format!("the scheme must be amqp or amqps, not {}", url.scheme()));
    }
    if url.cannot_be_a_base() || url.host_str().is_none_or(str::is_empty) {
        return Err("no host".into());
    }
    if url.path().contains(',') {
        return Err("its vhost holds a comma: give each address as a full amqp:// or amqps:// URL".into());
    }
    for (name, value) in url.query_pairs() {
        if INTEGER_PARAMETERS.contains(&name.as_ref()) && value.parse::<u64>().is_err() {
            return Err(format!("{name} must be a whole number"));
        }
    }
    Ok(BrokerAddress { url: entry.to_owned(), redacted: crate::redacted_url(entry) })
}

/// An entry that may not parse, with whatever sits between `:` and the last
/// `@` of its authority replaced by `***`, and secret parameters hidden when
/// it parses.
fn redacted_entry(entry: &str) -> String {
    if url::Url::parse(entry).is_ok() {
        return crate::redacted_url(entry);
    }
    // An entry that does not parse may hold a password anywhere in it, cut
    // short or not: nothing of it but its scheme is shown.
    match entry.split_once("://") {
        Some((scheme, _)) if scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) => {
            format!("{scheme}://***")
        }
        _ => "***".to_owned(),
    }
}

impl fmt::Debug for BrokerAddresses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.addresses).finish()
    }
}

impl fmt::Display for BrokerAddresses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, address) in self.addresses.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            f.write_str(address.redacted())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_its_order_and_shows_no_password() {
        let raw = "amqp://relay:mq-hunter2@mq1.internal:5672/%2f, amqps://relay:mq-hunter2@mq2.internal/%2f,\
                   amqp://mq3.internal:5682/%2f?heartbeat=10";
        let addresses: BrokerAddresses = raw.parse().unwrap();
        assert_eq!(addresses.len(), 3);
        assert_eq!(addresses.get(0).expose(), "amqp://relay:mq-hunter2@mq1.internal:5672/%2f");
        assert_eq!(addresses.get(1).host_port(), "mq2.internal:5671");
        assert_eq!(addresses.get(2).host_port(), "mq3.internal:5682");
        assert_eq!(addresses.get(4).host_port(), "mq2.internal:5671", "indexes wrap round");
        let shown = format!("{addresses:?} {addresses} {:?} {}", addresses.get(0), addresses.get(1));
        assert!(!shown.contains("mq-hunter2"), "{shown}");
        assert!(shown.contains("relay:***@mq1.internal:5672"), "{shown}");
        assert!(shown.contains("heartbeat=10"), "{shown}");
        let one: BrokerAddresses = "amqp://guest:guest@127.0.0.1:5672/%2f".parse().unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one.to_string(), "amqp://guest:***@127.0.0.1:5672/%2f");
    }

    #[test]
    fn a_bad_entry_is_named_by_position_and_shown_redacted() {
        let good = "amqp://relay:mq-hunter2@mq1.internal:5672/%2f";
        for (bad, expected) in [
            ("http://relay:mq-hunter2@mq2.internal/", "entry 2 of 2 (http://relay:***@mq2.internal/): the scheme"),
            ("mq2.internal:5672", "entry 1 of 1 (amqp://relay:***@mq1.internal:5672/%2f,mq2.internal:5672): its vhost"),
            ("amqp://relay:mq-hunter2@mq2.internal:notaport/%2f", "entry 2 of 2 (amqp://***): not a URL"),
            ("", "entry 2 of 2 (<blank>): blank"),
            ("amqp://relay:mq-hunter2@mq2.internal/%2f?heartbeat=soon", "heartbeat must be a whole number"),
            ("amqp:relay", "its vhost holds a comma"),
            (good, "listed twice"),
        ] {
            let message = format!("{good},{bad}").parse::<BrokerAddresses>().unwrap_err();
            assert!(message.contains(expected), "{bad}: {message}");
            assert!(!message.contains("mq-hunter2"), "{message}");
        }
        let trailing = format!("{good},").parse::<BrokerAddresses>().unwrap_err();
        assert!(trailing.contains("entry 2 of 2 (<blank>)"), "{trailing}");
        assert!("".parse::<BrokerAddresses>().unwrap_err().contains("entry 1 of 1"));
    }

    #[test]
    fn an_unparseable_entry_shows_nothing_but_its_scheme() {
        assert_eq!(redacted_entry("amqp://u:p@ss:w0rd@h:x/"), "amqp://***");
        assert_eq!(redacted_entry("amqp://h:notaport/?password=abc"), "amqp://***");
        assert_eq!(redacted_entry("h:5672"), "h:5672", "a URL with no password is shown");
    }

    #[test]
    fn a_comma_in_a_password_stays_in_its_url() {
        let addresses: BrokerAddresses =
            "amqp://relay:pa,ss@mq1.internal/%2f, amqp://relay:pa,ss@mq2.internal/%2f".parse().unwrap();
        assert_eq!(addresses.len(), 2);
        assert_eq!(addresses.get(0).expose(), "amqp://relay:pa,ss@mq1.internal/%2f");
        assert!(!addresses.to_string().contains("pa,ss"), "{addresses}");
        // Cut short inside its password, an entry shows none of it.
        let refused = "amqp://relay:pa,ss".parse::<BrokerAddresses>().unwrap_err();
        assert!(!refused.contains("pa,ss") && refused.contains("(amqp://***)"), "{refused}");
    }
}
