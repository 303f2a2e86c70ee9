//! Which registered addresses `llmroute discover` lets into an EDS file. Anyone who can write under a backend's
//! etcd prefix can register an address, and Envoy then connects to it carrying the backend's requests (and its
//! token). So an address that points Envoy at itself or at its own host is refused:
//! - loopback (127.0.0.0/8, ::1), unless the backend's `discovery.etcd.allow_loopback` is set (a fleet on
//!   Envoy's own host, the tests, the demo);
//! - link-local (169.254.0.0/16, which holds cloud metadata services; fe80::/10), unspecified (0.0.0.0/8, ::)
//!   and multicast or broadcast (224.0.0.0/4, 255.255.255.255, ff00::/8), always;
//! - Envoy's own admin and listener addresses, always, even with loopback allowed. One bound to all addresses
//!   (0.0.0.0 or ::) may be reached on any address of this host, so any address with its port is refused.
//!
//! An IPv4 address written as IPv4-mapped IPv6 (`::ffff:127.0.0.1`) is judged as the IPv4 address.

use std::net::{IpAddr, SocketAddr};

/// Why an address was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Loopback,
    LinkLocal,
    Unspecified,
    Multicast,
    /// Envoy's own admin address.
    EnvoyAdmin,
    /// Envoy's own listener: requests would loop through Envoy.
    EnvoyListener,
}

impl Refusal {
    /// The reason, as `discover` logs it, with the fix when there is one.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Loopback => {
                "a loopback address; set `discovery.etcd.allow_loopback: true` if the engines run on Envoy's host"
            }
            Refusal::LinkLocal => "a link-local address (169.254.0.0/16 or fe80::/10), never an engine's",
            Refusal::Unspecified => "an unspecified address (0.0.0.0/8 or ::), never an engine's",
            Refusal::Multicast => "a multicast or broadcast address, never an engine's",
            Refusal::EnvoyAdmin => "Envoy's own admin address",
            Refusal::EnvoyListener => "Envoy's own listener address",
        }
    }
}

/// What `discover` accepts for one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub allow_loopback: bool,
    /// Envoy's admin address (`admin`).
    pub admin: SocketAddr,
    /// Envoy's listener address (`listen`).
    pub listener: SocketAddr,
}

impl Policy {
    /// `Ok` when an instance at `ip:port` may join the EDS file.
    pub fn check(&self, ip: IpAddr, port: u16) -> Result<(), Refusal> {
        let ip = ip.to_canonical();
        for (own, refusal) in [
            (self.admin, Refusal::EnvoyAdmin),
            (self.listener, Refusal::EnvoyListener),
        ] {
            if reaches(own, ip, port) {
                return Err(refusal);
            }
        }
        match class(ip) {
            Some(Refusal::Loopback) if self.allow_loopback => Ok(()),
            Some(r) => Err(r),
            None => Ok(()),
        }
    }
}

/// True when a connection to `ip:port` may land on a socket bound to `own`.
fn reaches(own: SocketAddr, ip: IpAddr, port: u16) -> bool {
    let bound = own.ip().to_canonical();
    port == own.port() && (bound == ip || bound.is_unspecified())
}

/// The refused class an address falls in, if any.
fn class(ip: IpAddr) -> Option<Refusal> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_loopback() {
                Some(Refusal::Loopback)
            } else if a == 0 {
                Some(Refusal::Unspecified)
            } else if a == 169 && b == 254 {
                Some(Refusal::LinkLocal)
            } else if v4.is_multicast() || v4.is_broadcast() {
                Some(Refusal::Multicast)
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if v6.is_loopback() {
                Some(Refusal::Loopback)
            } else if v6.is_unspecified() {
                Some(Refusal::Unspecified)
            } else if v6.segments()[0] & 0xffc0 == 0xfe80 {
                Some(Refusal::LinkLocal)
            } else if v6.is_multicast() {
                Some(Refusal::Multicast)
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow_loopback: bool) -> Policy {
        Policy {
            allow_loopback,
            admin: "127.0.0.1:9901".parse().unwrap(),
            listener: "0.0.0.0:10000".parse().unwrap(),
        }
    }

    fn check(p: &Policy, addr: &str) -> Result<(), Refusal> {
        let a: SocketAddr = addr.parse().unwrap();
        p.check(a.ip(), a.port())
    }

    #[test]
    fn engine_addresses_pass() {
        for addr in [
            "10.0.0.5:8080",
            "192.168.1.2:9901",
            "203.0.113.9:10001",
            "[2001:db8::5]:8080",
            "[fd00::1]:80",
        ] {
            assert_eq!(check(&policy(false), addr), Ok(()), "{addr}");
        }
    }

    #[test]
    fn each_class_is_refused_and_only_loopback_can_be_allowed() {
        let cases = [
            ("127.0.0.1:8080", Refusal::Loopback),
            ("127.9.9.9:8080", Refusal::Loopback),
            ("[::1]:8080", Refusal::Loopback),
            ("[::ffff:127.0.0.1]:8080", Refusal::Loopback),
            ("169.254.169.254:80", Refusal::LinkLocal),
            ("[fe80::1]:8080", Refusal::LinkLocal),
            ("[::ffff:169.254.1.1]:80", Refusal::LinkLocal),
            ("0.0.0.0:8080", Refusal::Unspecified),
            ("0.1.2.3:8080", Refusal::Unspecified),
            ("[::]:8080", Refusal::Unspecified),
            ("224.0.0.1:8080", Refusal::Multicast),
            ("239.255.255.250:1900", Refusal::Multicast),
            ("255.255.255.255:8080", Refusal::Multicast),
            ("[ff02::1]:8080", Refusal::Multicast),
        ];
        for (addr, want) in cases {
            assert_eq!(check(&policy(false), addr), Err(want), "{addr}");
            let allowed = if want == Refusal::Loopback { Ok(()) } else { Err(want) };
            assert_eq!(check(&policy(true), addr), allowed, "{addr} with loopback allowed");
        }
    }

    #[test]
    fn envoys_own_addresses_are_refused_even_with_loopback_allowed() {
        let p = policy(true);
        assert_eq!(check(&p, "127.0.0.1:9901"), Err(Refusal::EnvoyAdmin));
        assert_eq!(
            check(&p, "127.0.0.2:9901"),
            Ok(()),
            "a socket bound to 127.0.0.1 is not reached there"
        );
        assert_eq!(check(&p, "[::ffff:127.0.0.1]:9901"), Err(Refusal::EnvoyAdmin));
        assert_eq!(check(&p, "10.0.0.5:9901"), Ok(()), "another host's port 9901");
        // The listener is bound to every address, so any address with its port may be this host.
        assert_eq!(check(&p, "10.0.0.5:10000"), Err(Refusal::EnvoyListener));
        assert_eq!(check(&p, "127.0.0.1:10000"), Err(Refusal::EnvoyListener));
        assert_eq!(check(&p, "127.0.0.1:10001"), Ok(()));
        let exact = Policy {
            admin: "10.0.0.7:9901".parse().unwrap(),
            ..policy(false)
        };
        assert_eq!(check(&exact, "10.0.0.7:9901"), Err(Refusal::EnvoyAdmin));
        assert_eq!(check(&exact, "10.0.0.8:9901"), Ok(()));
    }
}
