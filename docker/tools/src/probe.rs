//! What `llmroute-probe` checks: an HTTP URL (what it sends and how it reads the answer), or a file.
//!
//! The URL is `http://IP:PORT/PATH` with an IP literal: the binary is linked statically, and a static glibc
//! cannot resolve names reliably, while a health check only ever asks its own container (`127.0.0.1`). The
//! request is HTTP/1.1 (Envoy refuses 1.0) with `Connection: close`; only the status line of the answer is read,
//! so a body of any length or framing does not matter. A 2xx is healthy; anything else, or no answer, is not.
//!
//! `file:///PATH` checks a file instead: healthy when it exists, is a regular file and is not empty. A sidecar
//! that writes a file another container must find at start (`llmroute discover` writes the EDS file that Envoy
//! refuses to start without) is healthy once the file is there, so the reader can wait for it
//! (`depends_on: condition: service_healthy`).

use std::path::PathBuf;

use std::net::{IpAddr, SocketAddr};

/// Where to send the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub addr: SocketAddr,
    /// The path with its query, starting with `/`.
    pub path: String,
}

/// What to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Http(Target),
    /// An absolute path: healthy when it names a non-empty regular file.
    File(PathBuf),
}

/// Parses `http://IP:PORT[/PATH]` or `file:///PATH`. The error says what is wrong and what is accepted.
pub fn parse(arg: &str) -> Result<Check, String> {
    match arg.strip_prefix("file://") {
        Some(path) if path.starts_with('/') && !path.chars().any(char::is_control) => {
            Ok(Check::File(PathBuf::from(path)))
        }
        Some(_) => Err(format!(
            "{arg:?}: a file:// URL takes an absolute path without control characters, such as \
             file:///var/lib/llmroute/llama-a.eds.json"
        )),
        None => parse_url(arg).map(Check::Http),
    }
}

/// Whether a file of `len` bytes, regular or not, counts as healthy: a regular file with something in it.
pub fn file_healthy(is_file: bool, len: u64) -> Result<(), String> {
    match (is_file, len) {
        (false, _) => Err("not a regular file".into()),
        (true, 0) => Err("empty".into()),
        (true, _) => Ok(()),
    }
}

/// Parses `http://IP:PORT[/PATH]`. The error says what is wrong and what is accepted.
pub fn parse_url(url: &str) -> Result<Target, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?}: only http://IP:PORT/PATH and file:///PATH URLs are accepted"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let addr: SocketAddr = authority.parse().map_err(|_| {
        format!("{url:?}: the host must be an IP literal with a port (such as 127.0.0.1:8080 or [::1]:8080)")
    })?;
    if path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(format!(
            "{url:?}: the path may not contain spaces or control characters"
        ));
    }
    Ok(Target {
        addr,
        path: path.to_string(),
    })
}

/// The request's bytes.
pub fn request(target: &Target) -> String {
    let host = match target.addr.ip() {
        IpAddr::V4(ip) => format!("{ip}:{}", target.addr.port()),
        IpAddr::V6(ip) => format!("[{ip}]:{}", target.addr.port()),
    };
    format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: llmroute-probe\r\nConnection: close\r\n\r\n",
        target.path
    )
}

/// The status code of a response that starts with `head` (at least its status line).
pub fn status(head: &[u8]) -> Result<u16, String> {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = String::from_utf8_lossy(head.get(..line_end).unwrap_or(head));
    let mut parts = line.trim_end().splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    let code = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/") || code.len() != 3 {
        return Err(format!("not an HTTP status line: {:?}", truncate(&line, 80)));
    }
    code.parse()
        .map_err(|_| format!("not an HTTP status line: {:?}", truncate(&line, 80)))
}

/// True for a status that counts as healthy.
pub fn healthy(status: u16) -> bool {
    (200..300).contains(&status)
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => s.get(..i).unwrap_or(s),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ip_url_is_split_into_address_and_path() {
        let t = parse_url("http://127.0.0.1:9901/ready").unwrap();
        assert_eq!(t.addr, "127.0.0.1:9901".parse().unwrap());
        assert_eq!(t.path, "/ready");
        let t = parse_url("http://[::1]:8080").unwrap();
        assert_eq!(t.path, "/");
        assert_eq!(
            request(&t),
            "GET / HTTP/1.1\r\nHost: [::1]:8080\r\nUser-Agent: llmroute-probe\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(
            parse_url("http://127.0.0.1:9090/-/ready?x=1").unwrap().path,
            "/-/ready?x=1"
        );
    }

    #[test]
    fn names_https_missing_ports_and_bad_paths_are_refused_with_the_reason() {
        for (url, says) in [
            ("http://localhost:8080/health", "IP literal"),
            ("https://127.0.0.1:8080/health", "only http://"),
            ("http://127.0.0.1/health", "IP literal"),
            ("http://127.0.0.1:8080/a b", "spaces"),
            ("http://127.0.0.1:8080/a\r\nX: y", "control"),
        ] {
            let e = parse_url(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn a_file_url_is_an_absolute_path_checked_for_content() {
        assert_eq!(
            parse("file:///var/lib/llmroute/a.eds.json"),
            Ok(Check::File(PathBuf::from("/var/lib/llmroute/a.eds.json")))
        );
        assert!(matches!(parse("http://127.0.0.1:8080/health"), Ok(Check::Http(_))));
        for bad in ["file://relative/x", "file:///a\nb", "ftp://x"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("file://x").unwrap_err().contains("absolute path"));
        assert_eq!(file_healthy(true, 10), Ok(()));
        assert_eq!(file_healthy(true, 0), Err("empty".into()));
        assert_eq!(file_healthy(false, 10), Err("not a regular file".into()));
    }

    #[test]
    fn only_a_2xx_status_line_is_healthy() {
        assert_eq!(status(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"), Ok(200));
        assert_eq!(status(b"HTTP/1.0 503 Service Unavailable\r\n"), Ok(503));
        assert_eq!(status(b"HTTP/1.1 204"), Ok(204));
        assert!(healthy(200) && healthy(204) && !healthy(199) && !healthy(301) && !healthy(503));
        assert!(status(b"").is_err());
        assert!(status(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(status(b"HTTP/1.1 2000 OK\r\n").is_err());
        assert!(status(b"HTTP/1.1 abc OK\r\n").is_err());
    }
}
