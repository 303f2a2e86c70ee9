//! Parsing of `HOST:PORT` endpoint addresses and `IP:PORT` listen addresses.
//!
//! Endpoints become Envoy socket addresses: an IP literal gives a STATIC cluster, a DNS name a STRICT_DNS one.
//! The check is strict because Envoy would otherwise reject the rendered file at start-up, far from the typo.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A validated upstream endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// An IP literal (without brackets) or a DNS name.
    pub host: String,
    pub port: u16,
    /// True when `host` is an IP literal.
    pub is_ip: bool,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Parses `HOST:PORT`, where HOST is an IPv4 literal, a bracketed IPv6 literal, or a DNS name.
pub fn parse_endpoint(text: &str) -> Result<Endpoint, String> {
    if let Ok(sa) = text.parse::<SocketAddr>() {
        return endpoint_from_socket(sa);
    }
    if let Some(reason) = missing_port(text) {
        return Err(reason);
    }
    let (host, port) = text.rsplit_once(':').ok_or_else(|| "expected HOST:PORT".to_string())?;
    let port = parse_port(port)?;
    if host.starts_with('[') || host.parse::<IpAddr>().is_ok() {
        return Err("malformed IP literal (IPv6 needs brackets: [::1]:8080)".into());
    }
    check_dns_name(host)?;
    Ok(Endpoint {
        // DNS names are case-insensitive and a trailing dot is the same name: normalise so duplicates show.
        host: host.trim_end_matches('.').to_ascii_lowercase(),
        port,
        is_ip: false,
    })
}

/// A host written without its port: IPv4, bracketed IPv6 or a DNS name, alone or followed by a bare `:`.
enum Portless<'t> {
    Host(&'t str),
    /// A bare IPv6 literal: it needs brackets as well.
    Ipv6,
}

fn portless(text: &str) -> Option<Portless<'_>> {
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().is_ok().then_some(Portless::Host(text));
    }
    if text.parse::<Ipv6Addr>().is_ok() {
        return Some(Portless::Ipv6);
    }
    let host = text.strip_suffix(':').unwrap_or(text);
    let named = host.parse::<Ipv4Addr>().is_ok() || check_dns_name(host).is_ok();
    (named && !host.contains(':')).then_some(Portless::Host(host))
}

/// Why `text` is refused when it is a host without its port; `None` otherwise.
fn missing_port(text: &str) -> Option<String> {
    Some(match portless(text)? {
        Portless::Host(_) => "no port; write HOST:PORT".to_string(),
        Portless::Ipv6 => "malformed IP literal (IPv6 needs brackets, then the port: [::1]:8080)".to_string(),
    })
}

/// `text` with `port` after it, when `text` is a host written without its port: the address an error about it
/// can suggest. `None` for anything else.
pub fn with_port(text: &str, port: u16) -> Option<String> {
    match portless(text)? {
        Portless::Host(host) => Some(format!("{host}:{port}")),
        Portless::Ipv6 => None,
    }
}

/// Parses an `IP:PORT` listen address; names are not allowed, since Envoy binds it.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let sa: SocketAddr = text
        .parse()
        .map_err(|_| "expected IP:PORT, such as 127.0.0.1:10000".to_string())?;
    if sa.port() == 0 {
        return Err("port must be between 1 and 65535".into());
    }
    Ok(sa)
}

fn endpoint_from_socket(sa: SocketAddr) -> Result<Endpoint, String> {
    if sa.port() == 0 {
        return Err("port must be between 1 and 65535".into());
    }
    Ok(Endpoint {
        host: sa.ip().to_string(),
        port: sa.port(),
        is_ip: true,
    })
}

fn parse_port(text: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err("port must be between 1 and 65535".into()),
        Ok(p) if text.starts_with('+') => Err(format!("malformed port {p}")),
        Ok(p) => Ok(p),
    }
}

fn check_dns_name(host: &str) -> Result<(), String> {
    if host.is_empty() || host.len() > 253 {
        return Err("host name must be 1 to 253 characters".into());
    }
    for label in host.trim_end_matches('.').split('.') {
        let ok_chars = label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if label.is_empty() || label.len() > 63 || !ok_chars || label.starts_with('-') {
            return Err(format!("malformed host name label {label:?}"));
        }
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("malformed IPv4 address".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_endpoint() {
        let e = parse_endpoint("127.0.0.1:8081").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.is_ip), ("127.0.0.1", 8081, true));
        assert_eq!(e.to_string(), "127.0.0.1:8081");
    }

    #[test]
    fn ipv6_endpoint_round_trips_with_brackets() {
        let e = parse_endpoint("[::1]:8081").unwrap();
        assert_eq!(e.host, "::1");
        assert_eq!(e.to_string(), "[::1]:8081");
    }

    #[test]
    fn dns_endpoint() {
        let e = parse_endpoint("llama-0.llama.svc.cluster.local:8080").unwrap();
        assert!(!e.is_ip);
        assert_eq!(e.port, 8080);
    }

    #[test]
    fn a_missing_port_is_named_and_a_fix_offered() {
        for (text, fixed) in [
            ("127.0.0.1", "127.0.0.1:8000"),
            ("127.0.0.1:", "127.0.0.1:8000"),
            ("llama.internal", "llama.internal:8000"),
            ("[::1]", "[::1]:8000"),
            ("[fe80::1]", "[fe80::1]:8000"),
        ] {
            assert_eq!(
                parse_endpoint(text).unwrap_err(),
                "no port; write HOST:PORT",
                "{text:?}"
            );
            assert_eq!(with_port(text, 8000).as_deref(), Some(fixed), "{text:?}");
        }
        let v6 = parse_endpoint("::1").unwrap_err();
        assert!(v6.contains("IPv6 needs brackets, then the port: [::1]:8080"), "{v6}");
        // Anything else is not a missing port, and gets no suggestion.
        for other in [
            "::1",
            "127.0.0.1:http",
            "127.0.0.1:0",
            "bad host",
            "",
            "[::1",
            "http://h",
        ] {
            assert_eq!(with_port(other, 8000), None, "{other:?}");
        }
        assert_eq!(
            parse_endpoint("127.0.0.1:http").unwrap_err(),
            "port must be between 1 and 65535"
        );
    }

    #[test]
    fn malformed_endpoints_are_rejected() {
        for bad in [
            "",
            "127.0.0.1",
            "127.0.0.1:",
            "127.0.0.1:0",
            "127.0.0.1:65536",
            "127.0.0.1:80x",
            "127.0.0.1:+80",
            "300.0.0.1:80",
            "1.2.3:80",
            "::1:8080",
            "[::1:8080",
            "host name:80",
            "-bad.host:80",
            "a..b:80",
            ":8080",
            "http://127.0.0.1:8080",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn listen_needs_an_ip() {
        assert!(parse_listen("127.0.0.1:10000").is_ok());
        assert!(parse_listen("[::1]:10000").is_ok());
        assert!(parse_listen("localhost:10000").is_err());
        assert!(parse_listen("127.0.0.1:0").is_err());
    }
}
