//! Which network targets the service may connect to.
//!
//! Endpoint URLs are chosen by API users, so every outbound connection is a
//! potential server-side request forgery. This module holds the rules that keep
//! deliveries and registration probes on the public internet:
//!
//! - [`parse_target_url`] accepts only absolute `https` URLs with a host and no
//!   credentials;
//! - [`is_public`] says whether an address is on the public internet, judging the
//!   IPv4 inside the IPv6 forms that embed one;
//! - [`resolve_target`] resolves a URL's host and refuses it if *any* address is
//!   non-public (checking every address defeats split-horizon answers);
//! - [`GuardedResolver`] applies the same check to every resolution a
//!   [`reqwest::Client`] makes, so a name that is re-pointed inside after
//!   registration (DNS rebinding) is refused at delivery time.
//!
//! reqwest never calls its resolver for IP-literal hosts, so callers must run
//! [`check_literal_host`] on a URL before sending to it.
//!
//! All of it is bypassed when `TARGET_ALLOW_PRIVATE=true` (`allow_private`), which
//! exists for tests and private deployments.

use std::error::Error as StdError;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

/// Longest endpoint URL accepted, in bytes; longer ones are refused rather than
/// stored and sent on every delivery.
pub const MAX_URL_LEN: usize = 2048;

/// Port used when the URL names none (the `https` default).
const HTTPS_PORT: u16 = 443;

/// IPv4 ranges that are not on the public internet (IANA special-purpose
/// registry, plus everything from 224.0.0.0 up: multicast, reserved, broadcast).
const NON_PUBLIC_V4: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),       // "this network", unspecified
    (Ipv4Addr::new(10, 0, 0, 0), 8),      // private
    (Ipv4Addr::new(100, 64, 0, 0), 10),   // carrier-grade NAT
    (Ipv4Addr::new(127, 0, 0, 0), 8),     // loopback
    (Ipv4Addr::new(169, 254, 0, 0), 16),  // link-local, cloud metadata
    (Ipv4Addr::new(172, 16, 0, 0), 12),   // private
    (Ipv4Addr::new(192, 0, 0, 0), 24),    // IETF protocol assignments
    (Ipv4Addr::new(192, 0, 2, 0), 24),    // TEST-NET-1
    (Ipv4Addr::new(192, 88, 99, 0), 24),  // deprecated 6to4 relay anycast
    (Ipv4Addr::new(192, 168, 0, 0), 16),  // private
    (Ipv4Addr::new(198, 18, 0, 0), 15),   // benchmarking
    (Ipv4Addr::new(198, 51, 100, 0), 24), // TEST-NET-2
    (Ipv4Addr::new(203, 0, 113, 0), 24),  // TEST-NET-3
    (Ipv4Addr::new(224, 0, 0, 0), 4),     // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4),     // reserved, broadcast
];

/// IPv6 ranges that are not on the public internet. Forms that embed an IPv4
/// address (among them :: and ::1, inside ::/96) are judged before this table;
/// anything outside 2000::/3 (the only block IANA allocates for global unicast)
/// is refused after it.
const NON_PUBLIC_V6: &[(Ipv6Addr, u8)] = &[
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64),      // discard-only
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32),     // Teredo
    (Ipv6Addr::new(0x2001, 0x2, 0, 0, 0, 0, 0, 0), 48),   // benchmarking
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32), // documentation
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20),     // documentation (RFC 9637)
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),      // unique-local
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),     // link-local
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10),     // site-local
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),      // multicast
];

/// Global unicast space, 2000::/3.
const GLOBAL_UNICAST_V6: (Ipv6Addr, u8) = (Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3);

/// Whether `ip` is an address on the public internet, the only kind an endpoint
/// may point at unless private targets are allowed.
///
/// IPv6 forms that carry an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64,
/// 6to4) are judged by that IPv4 address, because that is where the packets end
/// up; Teredo is refused outright since its embedded server and client
/// addresses cannot both be trusted.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let bits = ip.to_bits();
    !NON_PUBLIC_V4.iter().any(|&(net, len)| {
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        bits & mask == net.to_bits() & mask
    })
}

fn in_v6(ip: Ipv6Addr, (net, len): (Ipv6Addr, u8)) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    ip.to_bits() & mask == net.to_bits() & mask
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let embedded = embedded_v4(ip);
    if !embedded.is_empty() {
        return embedded.into_iter().all(is_public_v4);
    }
    if NON_PUBLIC_V6.iter().any(|&range| in_v6(ip, range)) {
        return false;
    }
    in_v6(ip, GLOBAL_UNICAST_V6)
}

/// The IPv4 addresses an IPv6 address stands for, empty when it embeds none.
///
/// The local-use NAT64 prefix 64:ff9b:1::/48 may be subdivided with any RFC 6052
/// prefix length from /48 to /96, so every possible position is returned and
/// the caller demands that all of them are public.
fn embedded_v4(ip: Ipv6Addr) -> Vec<Ipv4Addr> {
    let o = ip.octets();
    let seg = ip.segments();
    let last32 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if seg[..5] == [0; 5] && (seg[5] == 0 || seg[5] == 0xffff) {
        // IPv4-compatible ::/96 (including :: and ::1) and IPv4-mapped ::ffff:0:0/96.
        return vec![last32];
    }
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // Well-known NAT64 prefix 64:ff9b::/96.
        return vec![last32];
    }
    if seg[..3] == [0x64, 0xff9b, 1] {
        // Local-use NAT64 64:ff9b:1::/48.
        return [48, 56, 64, 96].into_iter().map(|prefix| rfc6052_v4(&o, prefix)).collect();
    }
    if seg[0] == 0x2002 {
        // 6to4 2002::/16: the IPv4 address is in bits 16..48.
        return vec![Ipv4Addr::new(o[2], o[3], o[4], o[5])];
    }
    Vec::new()
}

/// The IPv4 address after an RFC 6052 prefix of `prefix_bits` bits: 32 bits
/// starting there, skipping the reserved octet at bits 64..72.
fn rfc6052_v4(octets: &[u8; 16], prefix_bits: usize) -> Ipv4Addr {
    let mut v4 = [0u8; 4];
    let picked =
        octets.iter().enumerate().skip(prefix_bits / 8).filter(|&(index, _)| index != 8).map(|(_, &octet)| octet);
    for (slot, octet) in v4.iter_mut().zip(picked) {
        *slot = octet;
    }
    Ipv4Addr::from(v4)
}

/// Why an endpoint URL was refused before any network access.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// The text is not an absolute URL.
    #[error("url must be an absolute URL")]
    Invalid(#[source] Option<url::ParseError>),
    /// The URL is longer than [`MAX_URL_LEN`].
    #[error("url must be at most 2048 characters")]
    TooLong,
    /// Deliveries are signed but not encrypted by the service itself, so only
    /// `https` targets are accepted.
    #[error("url scheme must be https")]
    NotHttps,
    /// The URL has no host to connect to.
    #[error("url must have a host")]
    NoHost,
    /// Credentials in a URL would be stored and logged in clear.
    #[error("url must not contain a user name or password")]
    Userinfo,
}

impl UrlError {
    /// The message shown to API users, free of parser internals.
    pub fn message(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "url must be an absolute URL",
            Self::TooLong => "url must be at most 2048 characters",
            Self::NotHttps => "url scheme must be https",
            Self::NoHost => "url must have a host",
            Self::Userinfo => "url must not contain a user name or password",
        }
    }
}

/// Parses an endpoint URL as given by an API user.
///
/// Nothing is trimmed: surrounding whitespace or control characters, which the
/// WHATWG parser would silently drop, are refused so the stored URL is exactly
/// what the user sent. Odd IPv4 spellings (`2130706433`, `0x7f.1`, `127.1`) come
/// out of the WHATWG host parser as [`Host::Ipv4`], so [`check_literal_host`]
/// sees the real address.
pub fn parse_target_url(raw: &str) -> Result<Url, UrlError> {
    if raw.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    if raw.chars().any(|c| c.is_control()) || raw.trim() != raw {
        return Err(UrlError::Invalid(None));
    }
    let url = Url::parse(raw).map_err(|e| UrlError::Invalid(Some(e)))?;
    if url.scheme() != "https" {
        return Err(UrlError::NotHttps);
    }
    if url.host().is_none() {
        return Err(UrlError::NoHost);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::Userinfo);
    }
    if url.as_str().len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    Ok(url)
}

/// `url` as it may appear in logs: scheme, host, port and path, without
/// user-info, query or fragment, where receivers put tokens.
pub fn loggable_url(url: &Url) -> String {
    let mut shown = url.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    // Only fails for URLs that cannot have credentials, which have none.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.to_string()
}

/// Why a target cannot be connected to; [`TargetError::code`] is the reason
/// recorded in a DeliveryLog.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The host name did not resolve, or resolved to no address.
    #[error("could not resolve the host")]
    Dns(#[source] io::Error),
    /// The host is, or resolves to, a non-public address and private targets are
    /// not allowed.
    #[error("the host is or resolves to a non-public address")]
    BlockedAddress,
    /// The URL has no host (only possible for URLs not from [`parse_target_url`]).
    #[error("the url has no host")]
    NoHost,
}

impl TargetError {
    /// The DeliveryLog `error` reason.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Dns(_) | Self::NoHost => "dns",
            Self::BlockedAddress => "blocked_address",
        }
    }

    /// The message shown to API users.
    pub fn message(&self) -> &'static str {
        match self {
            Self::Dns(_) => "the url's host could not be resolved",
            Self::BlockedAddress => {
                "the url's host is or resolves to a loopback, private, link-local or otherwise non-public address \
                 (a service that should deliver there runs with TARGET_ALLOW_PRIVATE=true)"
            }
            Self::NoHost => "url must have a host",
        }
    }
}

/// Refuses a URL whose host is a non-public IP literal.
///
/// reqwest connects to IP-literal hosts without asking its resolver, so
/// [`GuardedResolver`] never sees them: call this on every URL before sending.
/// Domain hosts pass here and are checked when resolved.
pub fn check_literal_host(url: &Url, allow_private: bool) -> Result<(), TargetError> {
    let ip = match url.host() {
        None => return Err(TargetError::NoHost),
        Some(Host::Domain(_)) => return Ok(()),
        Some(Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(Host::Ipv6(v6)) => IpAddr::V6(v6),
    };
    if allow_private || is_public(ip) { Ok(()) } else { Err(TargetError::BlockedAddress) }
}

/// Resolves the host of `url` to the socket addresses to try, in resolver order.
///
/// Unless `allow_private`, the target is refused when *any* address is
/// non-public: a name that answers both inside and outside addresses is an
/// attempt to reach the inside.
pub async fn resolve_target(url: &Url, allow_private: bool) -> Result<Vec<SocketAddr>, TargetError> {
    let port = url.port_or_known_default().unwrap_or(HTTPS_PORT);
    let domain = match url.host() {
        None => return Err(TargetError::NoHost),
        Some(Host::Ipv4(v4)) => return literal_target(IpAddr::V4(v4), port, allow_private),
        Some(Host::Ipv6(v6)) => return literal_target(IpAddr::V6(v6), port, allow_private),
        Some(Host::Domain(domain)) => domain,
    };
    let addrs = lookup(domain, port).await.map_err(TargetError::Dns)?;
    if !allow_private && addrs.iter().any(|addr| !is_public(addr.ip())) {
        return Err(TargetError::BlockedAddress);
    }
    Ok(addrs)
}

fn literal_target(ip: IpAddr, port: u16, allow_private: bool) -> Result<Vec<SocketAddr>, TargetError> {
    if allow_private || is_public(ip) { Ok(vec![SocketAddr::new(ip, port)]) } else { Err(TargetError::BlockedAddress) }
}

/// Resolves `host` with the system resolver, without duplicates; no address at
/// all is an error.
async fn lookup(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for addr in tokio::net::lookup_host((host, port)).await? {
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    if addrs.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address")));
    }
    Ok(addrs)
}

/// The error a [`GuardedResolver`] fails with when a name resolves to a
/// non-public address; found in a [`reqwest::Error`]'s source chain by
/// [`classify_reqwest_error`].
#[derive(Debug, thiserror::Error)]
#[error("blocked_address: {host} resolves to non-public address {addr}")]
pub struct BlockedAddressError {
    /// The name that was resolved.
    pub host: String,
    /// The first non-public address among the answers.
    pub addr: IpAddr,
}

/// A [`reqwest`] DNS resolver that refuses names resolving to any non-public
/// address, so a receiver's DNS cannot be re-pointed at the service's own network
/// after its endpoint was checked (DNS rebinding).
#[derive(Debug, Clone, Copy)]
pub struct GuardedResolver {
    allow_private: bool,
}

impl GuardedResolver {
    /// A resolver that checks addresses unless `allow_private`
    /// (`TARGET_ALLOW_PRIVATE`).
    pub fn new(allow_private: bool) -> Self {
        Self { allow_private }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Port 0: reqwest replaces it with the URL's port.
            let addrs = lookup(&host, 0).await?;
            let blocked = addrs.iter().find(|addr| !allow_private && !is_public(addr.ip()));
            match blocked {
                Some(blocked) => Err(BlockedAddressError { host, addr: blocked.ip() }.into()),
                None => Ok(Box::new(addrs.into_iter()) as Addrs),
            }
        })
    }
}

/// The DeliveryLog `error` reason for a failed request: one of `timeout`,
/// `connect`, `tls`, `dns`, `blocked_address`, `redirect`, `body`, `request`.
pub fn classify_reqwest_error(err: &reqwest::Error) -> &'static str {
    let mut blocked = false;
    let mut tls = false;
    for cause in causes(err) {
        blocked |= cause.is::<BlockedAddressError>();
        tls |= cause.is::<rustls::Error>();
    }
    if blocked {
        "blocked_address"
    } else if err.is_timeout() {
        "timeout"
    } else if err.is_dns() {
        "dns"
    } else if tls {
        "tls"
    } else if err.is_connect() {
        "connect"
    } else if err.is_redirect() {
        "redirect"
    } else if err.is_body() || err.is_decode() {
        "body"
    } else {
        "request"
    }
}

/// The longest `error_detail` kept: a sentence, not a dump.
const DETAIL_CAP: usize = 200;

/// What failed, in a short sentence safe to show the endpoint's owner (a
/// delivery log's `error_detail`): the kind, as [`classify_reqwest_error`]
/// names it, and the most specific reason beneath it (the TLS alert or
/// certificate problem, the DNS answer, the refused connection). reqwest's
/// own message is left out, because it names the URL, whose query may hold a
/// token; so is any reason that holds a URL.
pub fn describe_reqwest_error(err: &reqwest::Error, timeout: std::time::Duration) -> String {
    let reason = causes(err)
        .skip(1)
        .map(|cause| cause.to_string())
        .filter(|text| !text.is_empty() && !text.contains("://"))
        .last();
    let reason = reason.map(|text| safe_detail(&text));
    let with = |what: &str| match &reason {
        Some(reason) => format!("{what}: {reason}"),
        None => what.to_owned(),
    };
    match classify_reqwest_error(err) {
        "blocked_address" => with("not sent: the address is not public"),
        "timeout" => format!("timed out: no complete answer within {}s", timeout.as_secs_f64()),
        "dns" => with("DNS lookup failed"),
        "tls" => with("TLS handshake failed"),
        "connect" => with("connection failed"),
        "redirect" => "redirects are not followed".to_owned(),
        "body" => with("the request body could not be sent"),
        _ => with("the request failed"),
    }
}

/// `text` as an `error_detail` may hold it: one line, no control
/// characters, at most [`DETAIL_CAP`] bytes (cut at a character boundary).
pub fn safe_detail(text: &str) -> String {
    let line: String = text.lines().next().unwrap_or_default().chars().filter(|c| !c.is_control()).collect();
    let mut end = line.len().min(DETAIL_CAP);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].trim().to_owned()
}

/// `err` and every error beneath it.
///
/// An [`io::Error`] is entered through [`io::Error::get_ref`], not
/// `source()`: its `source()` skips the error it wraps, which is exactly where
/// tokio-rustls puts the [`rustls::Error`] of a failed handshake (and hyper-rustls
/// wraps that I/O error in another one).
pub(crate) fn causes<'a>(err: &'a (dyn StdError + 'static)) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(err), |&current| match current.downcast_ref::<io::Error>() {
        Some(io_err) => io_err.get_ref().map(|inner| inner as &(dyn StdError + 'static)),
        None => current.source(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_urls_carry_no_query() {
        let url = Url::parse("https://hooks.example.com:8443/in/abc?token=s3cret&x=1#frag").unwrap();
        assert_eq!(loggable_url(&url), "https://hooks.example.com:8443/in/abc");
        let with_userinfo = Url::parse("https://user:pw@example.com/p?q").unwrap();
        assert_eq!(loggable_url(&with_userinfo), "https://example.com/p");
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    #[test]
    fn non_public_addresses_are_refused() {
        let non_public = [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.255.254",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "198.19.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "100::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b::7f00:1",
            "64:ff9b:1::a00:1",
            "64:ff9b:1:a00:0:1::",
            "2002:7f00:1::",
            "2002:a00:1::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "3fff::1",
            "4000::1",
            "::ffff:0:a00:1",
        ];
        for text in non_public {
            assert!(!is_public(ip(text)), "{text} must not be public");
        }
    }

    #[test]
    fn public_addresses_are_accepted() {
        let public = [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.215.14",
            "172.32.0.1",
            "100.128.0.1",
            "192.0.1.1",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ];
        for text in public {
            assert!(is_public(ip(text)), "{text} must be public");
        }
    }

    #[test]
    fn local_nat64_needs_every_embedding_public() {
        // The /96 embedding reads 8.8.8.8 but the /48 embedding reads 10.0.0.0.
        assert!(!is_public(ip("64:ff9b:1:a00:0:1:808:808")));
        assert!(is_public(ip("64:ff9b:1:808:8:8:808:808")));
    }

    #[test]
    fn literal_hosts_are_checked_however_spelled() {
        let refused = [
            "https://127.0.0.1/",
            "https://2130706433/",
            "https://0x7f.1/",
            "https://0177.0.0.1/",
            "https://127.1/",
            "https://0x7f000001/",
            "https://0/",
            "https://012.1/",
            "https://169.254.169.254/latest/meta-data/",
            "https://[::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://[::ffff:7f00:1]:8443/",
            "https://[fe80::1]/",
            "https://[64:ff9b::a00:1]/",
            "https://[2002:7f00:1::]/",
        ];
        for raw in refused {
            let url = parse_target_url(raw).expect("parses");
            assert!(
                matches!(check_literal_host(&url, false), Err(TargetError::BlockedAddress)),
                "{raw} must be refused"
            );
            assert!(check_literal_host(&url, true).is_ok(), "{raw} allowed when private");
        }
        for raw in ["https://8.8.8.8/", "https://[2606:4700:4700::1111]/", "https://example.com/"] {
            let url = parse_target_url(raw).expect("parses");
            assert!(check_literal_host(&url, false).is_ok(), "{raw} must pass");
        }
    }

    #[test]
    fn odd_ipv4_spellings_parse_as_ipv4_hosts() {
        for raw in ["https://2130706433/", "https://0x7f.1/", "https://0177.0.0.1/", "https://127.1/"] {
            let url = parse_target_url(raw).expect("parses");
            assert_eq!(url.host(), Some(Host::Ipv4(Ipv4Addr::LOCALHOST)), "{raw}");
        }
    }

    #[test]
    fn parse_refuses_what_is_not_an_https_url() {
        type Expected = fn(&UrlError) -> bool;
        let cases: [(&str, Expected); 11] = [
            ("http://example.com/", |e| matches!(e, UrlError::NotHttps)),
            ("ftp://example.com/", |e| matches!(e, UrlError::NotHttps)),
            ("HTTP://example.com/", |e| matches!(e, UrlError::NotHttps)),
            ("/hooks", |e| matches!(e, UrlError::Invalid(_))),
            ("example.com/hooks", |e| matches!(e, UrlError::Invalid(_))),
            ("https://", |e| matches!(e, UrlError::Invalid(_))),
            ("https:", |e| matches!(e, UrlError::Invalid(_))),
            ("https://user:pass@example.com/", |e| matches!(e, UrlError::Userinfo)),
            ("https://user@example.com/", |e| matches!(e, UrlError::Userinfo)),
            (" https://example.com/", |e| matches!(e, UrlError::Invalid(None))),
            ("https://exa\tmple.com/", |e| matches!(e, UrlError::Invalid(None))),
        ];
        for (raw, expected) in cases {
            match parse_target_url(raw) {
                Ok(url) => panic!("{raw:?} accepted as {url}"),
                Err(err) => assert!(expected(&err), "{raw:?} refused as {err:?}"),
            }
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert!(matches!(parse_target_url(&long), Err(UrlError::TooLong)));
    }

    #[test]
    fn parse_accepts_https_urls() {
        let url = parse_target_url("https://Example.COM:8443/hooks?x=1").expect("valid");
        assert_eq!(url.host_str(), Some("example.com"));
        assert_eq!(url.port(), Some(8443));
        assert!(parse_target_url("https://hooks.example.com/").is_ok());
        assert!(parse_target_url(&format!("https://e.com/{}", "a".repeat(2000))).is_ok());
    }

    #[test]
    fn url_errors_have_user_messages() {
        assert_eq!(UrlError::NotHttps.message(), "url scheme must be https");
        assert_eq!(UrlError::Userinfo.to_string(), UrlError::Userinfo.message());
    }

    #[tokio::test]
    async fn localhost_is_refused_unless_private_allowed() {
        let url = parse_target_url("https://localhost/").expect("valid");
        let err = resolve_target(&url, false).await.expect_err("refused");
        assert!(matches!(err, TargetError::BlockedAddress), "{err:?}");
        assert_eq!(err.code(), "blocked_address");

        let addrs = resolve_target(&url, true).await.expect("allowed");
        assert!(!addrs.is_empty());
        assert!(addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 443), "{addrs:?}");
    }

    #[tokio::test]
    async fn literal_targets_resolve_without_dns() {
        let url = parse_target_url("https://8.8.8.8:8443/").expect("valid");
        let addrs = resolve_target(&url, false).await.expect("public literal");
        assert_eq!(addrs, vec![SocketAddr::from(([8, 8, 8, 8], 8443))]);

        let url = parse_target_url("https://0x7f.1/").expect("valid");
        assert!(matches!(resolve_target(&url, false).await, Err(TargetError::BlockedAddress)));
    }

    #[tokio::test]
    async fn unknown_names_are_dns_errors() {
        let url = parse_target_url("https://no-such-host.invalid/").expect("valid");
        let err = resolve_target(&url, true).await.expect_err("does not resolve");
        assert!(matches!(err, TargetError::Dns(_)), "{err:?}");
        assert_eq!(err.code(), "dns");
    }

    #[tokio::test]
    async fn guarded_resolver_refuses_non_public_answers() {
        let name: Name = "localhost".parse().expect("name");
        let err = match GuardedResolver::new(false).resolve(name).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(err) => err,
        };
        let blocked = err.downcast_ref::<BlockedAddressError>().expect("a BlockedAddressError");
        assert_eq!(blocked.host, "localhost");
        assert!(blocked.addr.is_loopback());

        let name: Name = "localhost".parse().expect("name");
        let addrs: Vec<_> = GuardedResolver::new(true).resolve(name).await.expect("allowed").collect();
        assert!(!addrs.is_empty());
    }
}
