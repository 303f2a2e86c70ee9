//! Requests that a well-behaved client library cannot send, written byte by byte on a socket: HTTP/1.1 framing
//! conflicts (request smuggling), bad request lines and header names, raw control bytes, and HTTP/2 frames that
//! break the protocol's rules.
//!
//! Each must end in a refusal in a JSON envelope (Envoy's own, rewritten by `local_reply_config`, or the
//! filter's), or in a reset or closed connection, and never in a request at an engine. After each group, a
//! normal request still routes and no wasm VM has failed.

use std::time::Duration;

use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::corpus::assert_wasm_healthy;
use crate::support::*;

async fn setup(limits: Value) -> (Fleet, Envoy) {
    let fleet = Fleet::start("llama-a", 2).await.unwrap();
    let config = json!({
        "version": 1,
        "backends": [fleet.backend_entry(150)],
        "models": [{"name": ALIAS, "routes": [{"backend": "llama-a", "upstream_model": UPSTREAM}]}],
        "limits": limits,
    });
    let envoy = Envoy::start(config).await.unwrap();
    (fleet, envoy)
}

/// Inference requests the engines received (health checks are not counted).
fn engine_posts(fleet: &Fleet) -> Vec<llmroute_harness::emulator::RecordedRequest> {
    fleet
        .engines
        .iter()
        .flat_map(|e| e.requests())
        .filter(|r| r.method != "GET")
        .collect()
}

const BODY: &str = r#"{"model": "local-chat", "messages": [{"role": "user", "content": "first-turn"}]}"#;

/// One HTTP/1.1 request head (CRLF line ends) followed by `body`.
fn h1(lines: &[&str], body: &str) -> Vec<u8> {
    let mut out = lines.join("\r\n").into_bytes();
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body.as_bytes());
    out
}

/// Writes `bytes`, half-closes when `shut`, and reads until the server closes (at most 5 s). Returns what came
/// back, and whether the server closed the connection.
async fn exchange(envoy: &Envoy, bytes: &[u8], shut: bool) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(envoy.listen).await.unwrap();
    // The server may close while we still write; what it answered is still readable.
    let _ = s.write_all(bytes).await;
    if shut {
        let _ = s.shutdown().await;
    }
    let mut out = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .is_ok();
    (out, closed)
}

/// One HTTP/1.1 response parsed off the front of `raw`: status, lowercase head, body (content-length framed).
struct Response {
    status: u16,
    head: String,
    body: Value,
}

fn first_response(raw: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let head = head.to_ascii_lowercase();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(rest.len());
    let body = serde_json::from_str(rest.get(..len).unwrap_or(rest)).unwrap_or(Value::Null);
    Some(Response { status, head, body })
}

/// A refusal: either nothing at all (the connection was closed) or a 4xx (or Envoy's 501 for an unsupported
/// transfer coding) in a JSON envelope whose code is also in `x-llmroute-error`. Returns the status (0: closed).
fn refusal((raw, closed): &(Vec<u8>, bool)) -> Result<u16, String> {
    let text = String::from_utf8_lossy(raw).into_owned();
    match (raw.is_empty(), closed) {
        (true, true) => return Ok(0),
        (true, false) => return Err("no answer, and the connection stayed open".into()),
        _ => {}
    }
    let r = first_response(raw).ok_or_else(|| format!("not an HTTP response: {text:?}"))?;
    if !(400..500).contains(&r.status) && r.status != 501 {
        return Err(format!("not a refusal: {text}"));
    }
    if !r.head.contains("content-type: application/json") {
        return Err(format!("not JSON: {text}"));
    }
    if r.head.contains("set-cookie") {
        return Err(format!("a header was injected: {text}"));
    }
    let code = r.body["error"]["code"]
        .as_str()
        .ok_or_else(|| format!("no envelope: {text}"))?;
    if !r.head.contains(&format!("x-llmroute-error: {code}")) || r.body["error"]["message"].as_str().is_none() {
        return Err(format!("envelope and x-llmroute-error disagree: {text}"));
    }
    // A refusal is the client's fault, never labelled a server error (Envoy's 501 for a transfer coding included).
    if r.body["error"]["type"] != "invalid_request_error" {
        return Err(format!("a refusal typed as a server error: {text}"));
    }
    Ok(r.status)
}

/// What a raw HTTP/1.1 case must end in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    /// This status, in an envelope (0: the connection closed with no answer).
    Status(u16),
    /// Envoy normalises the head (unfolds a folded line, drops a bare CR, ends a line at a bare LF) and the request
    /// is routed: the engine gets the exact body once, and nothing unsafe comes back in a response header.
    Routed,
}

/// Checks a routed case: one engine request with the client's body, and a clean response head.
fn routed(raw: &[u8], fleet: &Fleet) -> Result<(), String> {
    let text = String::from_utf8_lossy(raw).into_owned();
    let r = first_response(raw).ok_or_else(|| format!("no response: {text:?}"))?;
    if r.status != 200 {
        return Err(format!("not routed: {text}"));
    }
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(raw.len());
    let head = &raw[..head_end];
    if head.iter().any(|&b| b == 0 || b >= 0x7f) || r.head.contains("set-cookie") {
        return Err(format!("unsafe response head: {text:?}"));
    }
    if head
        .split(|&b| b == b'\n')
        .any(|l| l.iter().take(l.len().saturating_sub(1)).any(|&b| b == b'\r'))
    {
        return Err(format!("a bare CR in the response head: {text:?}"));
    }
    let seen = engine_posts(fleet);
    let bodies: Vec<String> = seen
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    if bodies.len() != 1 || bodies[0] != BODY.replace(ALIAS, UPSTREAM) {
        return Err(format!("the engine did not get the body exactly once: {bodies:?}"));
    }
    fleet.reset();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_framing_conflicts_and_malformed_heads_never_reach_an_engine() {
    let (fleet, envoy) = setup(json!({})).await;
    let host = "Host: gw";
    let ct = "Content-Type: application/json";
    let cl = format!("Content-Length: {}", BODY.len());
    let chunked = format!("{:x}\r\n{BODY}\r\n0\r\n\r\n", BODY.len());
    let line = "POST /v1/chat/completions HTTP/1.1";
    let close = "Connection: close";
    let nope = BODY.replace(ALIAS, "nope");
    let nope_cl = format!("Content-Length: {}", nope.len());
    // (name, bytes, half-close after writing, what it must end in).
    let cases: Vec<(&str, Vec<u8>, bool, Want)> = vec![
        (
            "content-length and transfer-encoding",
            h1(&[line, host, ct, &cl, "Transfer-Encoding: chunked"], &chunked),
            false,
            Want::Status(400),
        ),
        (
            "transfer-encoding and content-length, reversed",
            h1(
                &[line, host, ct, "Transfer-Encoding: chunked", "Content-Length: 4"],
                &chunked,
            ),
            false,
            Want::Status(400),
        ),
        (
            "transfer-encoding: chunked, identity",
            h1(&[line, host, ct, "Transfer-Encoding: chunked, identity"], &chunked),
            false,
            Want::Status(501),
        ),
        (
            "transfer-encoding: identity",
            h1(&[line, host, ct, "Transfer-Encoding: identity", &cl], BODY),
            false,
            Want::Status(400),
        ),
        (
            "transfer-encoding: xchunked",
            h1(&[line, host, ct, "Transfer-Encoding: xchunked"], &chunked),
            false,
            Want::Status(501),
        ),
        (
            "transfer-encoding by obsolete line folding",
            h1(&[line, host, ct, close, "Transfer-Encoding:", " chunked"], &chunked),
            false,
            Want::Routed,
        ),
        (
            "two transfer-encoding headers",
            h1(
                &[
                    line,
                    host,
                    ct,
                    "Transfer-Encoding: chunked",
                    "Transfer-Encoding: chunked",
                ],
                &chunked,
            ),
            false,
            Want::Status(501),
        ),
        (
            "two differing content-lengths",
            h1(&[line, host, ct, "Content-Length: 5", &cl], BODY),
            false,
            Want::Status(400),
        ),
        (
            "content-length list with two values",
            h1(&[line, host, ct, &format!("Content-Length: {0}, 5", BODY.len())], BODY),
            false,
            Want::Status(400),
        ),
        (
            "negative content-length",
            h1(&[line, host, ct, "Content-Length: -1"], BODY),
            false,
            Want::Status(400),
        ),
        (
            "content-length +12",
            h1(&[line, host, ct, "Content-Length: +12"], BODY),
            false,
            Want::Status(400),
        ),
        (
            "content-length 0x10",
            h1(&[line, host, ct, "Content-Length: 0x10"], BODY),
            false,
            Want::Status(400),
        ),
        (
            "content-length abc",
            h1(&[line, host, ct, "Content-Length: abc"], BODY),
            false,
            Want::Status(400),
        ),
        (
            "content-length past u64",
            h1(&[line, host, ct, "Content-Length: 99999999999999999999999"], BODY),
            false,
            Want::Status(400),
        ),
        (
            "chunk size not hex",
            h1(
                &[line, host, ct, "Transfer-Encoding: chunked"],
                &format!("zz\r\n{BODY}\r\n0\r\n\r\n"),
            ),
            false,
            Want::Status(400),
        ),
        (
            "chunk size past u64",
            h1(
                &[line, host, ct, "Transfer-Encoding: chunked"],
                "ffffffffffffffffffff\r\nab\r\n0\r\n\r\n",
            ),
            false,
            Want::Status(400),
        ),
        (
            "chunk shorter than its size",
            h1(
                &[line, host, ct, "Transfer-Encoding: chunked"],
                &format!("ffff\r\n{BODY}\r\n0\r\n\r\n"),
            ),
            true,
            Want::Status(0),
        ),
        (
            "body shorter than content-length, then the client hangs up",
            h1(&[line, host, ct, "Content-Length: 4096"], BODY),
            true,
            Want::Status(0),
        ),
        (
            "space before the colon",
            h1(&[line, host, ct, "Content-Length : 5", &cl], BODY),
            false,
            Want::Status(400),
        ),
        (
            "header name with a space",
            h1(&[line, host, ct, "X Session: a", &cl], BODY),
            false,
            Want::Status(400),
        ),
        (
            "CR inside a header value",
            h1(&[line, host, ct, close, "X-Session-Id: a\rb", &cl], BODY),
            false,
            Want::Routed,
        ),
        (
            "NUL inside a header value",
            h1(&[line, host, ct, "X-Session-Id: a\0b", &cl], BODY),
            false,
            Want::Status(400),
        ),
        (
            "bare LF smuggling a header into the session id",
            h1(&[line, host, ct, close, "X-Session-Id: a\nSet-Cookie: x=1", &cl], BODY),
            false,
            Want::Routed,
        ),
        (
            "non-ASCII bytes in the raw path",
            {
                let mut b = b"POST /v1/chat/completions\xff\xfe HTTP/1.1\r\nHost: gw\r\n".to_vec();
                b.extend_from_slice(format!("{ct}\r\n{cl}\r\n\r\n{BODY}").as_bytes());
                b
            },
            false,
            Want::Status(400),
        ),
        (
            "non-ASCII bytes in a header name",
            {
                let mut b = format!("{line}\r\n{host}\r\n{ct}\r\n{cl}\r\n").into_bytes();
                b.extend_from_slice(b"x-\xffname: v\r\n\r\n");
                b.extend_from_slice(BODY.as_bytes());
                b
            },
            false,
            Want::Status(400),
        ),
        (
            "version HTTP/1.2",
            h1(&["POST /v1/chat/completions HTTP/1.2", host, ct, &cl], BODY),
            false,
            Want::Status(426),
        ),
        (
            "version HTTP/9.9",
            h1(&["POST /v1/chat/completions HTTP/9.9", host, ct, &cl], BODY),
            false,
            Want::Status(426),
        ),
        (
            "version HTTP/1.1x",
            h1(&["POST /v1/chat/completions HTTP/1.1x", host, ct, &cl], BODY),
            false,
            Want::Status(400),
        ),
        (
            "lowercase version",
            h1(&["POST /v1/chat/completions http/1.1", host, ct, &cl], BODY),
            false,
            Want::Status(400),
        ),
        (
            "no version (HTTP/0.9)",
            format!("POST /v1/chat/completions\r\n\r\n{BODY}").into_bytes(),
            false,
            Want::Status(426),
        ),
        (
            "space in the request target",
            h1(&["POST /v1/chat/ completions HTTP/1.1", host, ct, &cl], BODY),
            false,
            Want::Status(400),
        ),
        (
            "method with a slash",
            h1(&["PO/ST /v1/chat/completions HTTP/1.1", host, ct, &cl], BODY),
            false,
            Want::Status(400),
        ),
        (
            "absolute URI to another host, unknown model",
            h1(
                &[
                    "POST http://evil.example/v1/chat/completions HTTP/1.1",
                    host,
                    ct,
                    &nope_cl,
                ],
                &nope,
            ),
            false,
            Want::Status(404),
        ),
        (
            "absolute URI with a non-http scheme",
            h1(&["POST ftp://gw/v1/chat/completions HTTP/1.1", host, ct, &cl], BODY),
            false,
            Want::Status(400),
        ),
    ];
    let mut failures = Vec::new();
    for (name, bytes, shut, want) in &cases {
        let t = std::time::Instant::now();
        let got = exchange(&envoy, bytes, *shut).await;
        let raw = &got.0;
        eprintln!(
            "{name}: {:?} in {:?}",
            first_response(raw).map(|r| (r.status, r.body["error"]["code"].clone())),
            t.elapsed()
        );
        let outcome = match want {
            Want::Routed => routed(raw, &fleet),
            Want::Status(w) => match refusal(&got) {
                Ok(status) if status == *w => Ok(()),
                Ok(status) => Err(format!("status {status}, want {w}: {}", String::from_utf8_lossy(raw))),
                Err(why) => Err(why),
            },
        };
        if let Err(why) = outcome {
            failures.push(format!("{name}: {why}"));
        }
        let reached = engine_posts(&fleet);
        if !reached.is_empty() {
            failures.push(format!(
                "{name}: {} request(s) reached an engine: {:?}",
                reached.len(),
                reached[0].body
            ));
            fleet.reset();
        }
    }
    if !failures.is_empty() {
        eprintln!("{}", envoy.log());
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    let (status, _, _) = post(&client(), &envoy, &chat(None, "after"), &[]).await;
    assert_eq!(status, 200);
    assert_wasm_healthy(&envoy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_than_its_content_length_never_carries_a_second_request_into_the_first() {
    let (fleet, envoy) = setup(json!({})).await;
    let second = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        BODY.len() + 3,
        BODY.replace("first-turn", "smuggled-turn")
    );
    // 1. The length covers only part of the JSON: the first is refused for its truncated body, and the rest is
    //    never glued onto it.
    let cut = 30;
    let mut bytes = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {cut}\r\n\r\n"
    )
    .into_bytes();
    bytes.extend_from_slice(BODY.as_bytes());
    bytes.extend_from_slice(second.as_bytes());
    let (raw, _) = exchange(&envoy, &bytes, false).await;
    let r = first_response(&raw).unwrap_or_else(|| panic!("no response: {:?}", String::from_utf8_lossy(&raw)));
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(
        r.body["error"]["code"],
        "invalid_json",
        "{}",
        String::from_utf8_lossy(&raw)
    );
    // Envoy closes after the 400: the bytes after the first body are never read as a request of their own either.
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "{text}");
    assert!(engine_posts(&fleet).is_empty(), "{:?}", engine_posts(&fleet));
    // 2. The length is exact and a second request follows on the same connection: each reaches an engine as
    //    itself, byte for byte, or the second not at all.
    let mut bytes = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
    .into_bytes();
    bytes.extend_from_slice(second.as_bytes());
    let (raw, _) = exchange(&envoy, &bytes, false).await;
    let first = first_response(&raw).unwrap_or_else(|| panic!("no response: {:?}", String::from_utf8_lossy(&raw)));
    assert_eq!(first.status, 200, "{}", String::from_utf8_lossy(&raw));
    let seen = engine_posts(&fleet);
    let bodies: Vec<String> = seen
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    let firsts = bodies.iter().filter(|b| b.contains("first-turn")).count();
    assert_eq!(firsts, 1, "{bodies:?}");
    for b in &bodies {
        let v: Value =
            serde_json::from_str(b).unwrap_or_else(|e| panic!("an engine got a body that is not JSON ({e}): {b}"));
        assert!(!(b.contains("first-turn") && b.contains("smuggled-turn")), "{b}");
        assert!(
            !b.contains("HTTP/1.1"),
            "a request line reached an engine inside a body: {b}"
        );
        assert_eq!(v["model"], UPSTREAM, "{b}");
    }
    assert!(!raw.is_empty());
    assert_wasm_healthy(&envoy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_with_an_underscore_is_dropped_before_the_engine() {
    let (fleet, envoy) = setup(json!({})).await;
    let bytes = h1(
        &[
            "POST /v1/chat/completions HTTP/1.1",
            "Host: gw",
            "Content-Type: application/json",
            "Connection: close",
            "x_llmroute_cluster: evil",
            "x_session_id: under",
            &format!("Content-Length: {}", BODY.len()),
        ],
        BODY,
    );
    let (raw, _) = exchange(&envoy, &bytes, false).await;
    let r = first_response(&raw).unwrap_or_else(|| panic!("no response: {:?}", String::from_utf8_lossy(&raw)));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&raw));
    let seen = engine_posts(&fleet);
    assert_eq!(seen.len(), 1);
    let names: Vec<&str> = seen[0].headers.iter().map(|(k, _)| k.as_str()).collect();
    assert!(names.iter().all(|n| !n.contains('_')), "{names:?}");
    // The dropped header was not taken as a session id either.
    assert!(!r.head.contains("x-multi-turn-session-id"), "{}", r.head);
}

// ---- HTTP/2, frame by frame ----

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;
const ACK: u8 = 1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK integer with an `n`-bit prefix whose high bits are `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// A header block of literal fields without indexing, names sent exactly as given (no Huffman).
fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in fields {
        out.push(0);
        hpack_int(&mut out, 0, 7, k.len());
        out.extend_from_slice(k.as_bytes());
        hpack_int(&mut out, 0, 7, v.len());
        out.extend_from_slice(v.as_bytes());
    }
    out
}

fn request_fields(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut f = vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1/chat/completions"),
        (":authority", "gw"),
        ("content-type", "application/json"),
    ];
    f.extend_from_slice(extra);
    f
}

/// What the server did to the streams of one connection.
#[derive(Debug, Default)]
struct H2Outcome {
    /// (stream, error code) of each RST_STREAM.
    resets: Vec<(u32, u32)>,
    /// Streams that got a response HEADERS frame.
    answered: Vec<u32>,
    /// The GOAWAY error code, if the connection was closed.
    goaway: Option<u32>,
    /// The server closed the connection.
    closed: bool,
}

/// Opens an HTTP/2 connection, sends `frames` after the preface and SETTINGS, and reads until every stream in
/// `streams` is reset or answered, a GOAWAY, the connection closes, or 5 s pass.
async fn h2_exchange(envoy: &Envoy, frames: &[Vec<u8>], streams: &[u32]) -> H2Outcome {
    let mut s = TcpStream::connect(envoy.listen).await.unwrap();
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    for f in frames {
        out.extend_from_slice(f);
    }
    let _ = s.write_all(&out).await;
    let mut got = H2Outcome::default();
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        while buf.len() >= 9 {
            let len = ((buf[0] as usize) << 16) | ((buf[1] as usize) << 8) | buf[2] as usize;
            if buf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (buf[3], buf[4]);
            let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
            let payload = buf[9..9 + len].to_vec();
            buf.drain(..9 + len);
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    let _ = s.write_all(&frame(SETTINGS, ACK, 0, &[])).await;
                }
                RST_STREAM => got.resets.push((
                    stream,
                    u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]),
                )),
                HEADERS => got.answered.push(stream),
                GOAWAY => got.goaway = Some(u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]])),
                _ => {}
            }
        }
        let done = |g: &H2Outcome| {
            g.goaway.is_some()
                || streams
                    .iter()
                    .all(|id| g.answered.contains(id) || g.resets.iter().any(|(r, _)| r == id))
        };
        if done(&got) {
            return got;
        }
        let mut chunk = [0u8; 16384];
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            Ok(_) => {
                got.closed = true;
                return got;
            }
            Err(_) => return got,
        }
    }
}

const REFUSED_STREAM: u32 = 7;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_frames_that_break_the_rules_are_reset_and_never_reach_an_engine() {
    let (fleet, envoy) = setup(json!({"max_concurrent_streams": 8})).await;
    let body = BODY.as_bytes();
    let headers = |extra: &[(&'static str, &'static str)], eos: bool| {
        frame(
            HEADERS,
            END_HEADERS | if eos { END_STREAM } else { 0 },
            1,
            &hpack(&request_fields(extra)),
        )
    };
    let with_body =
        |extra: &[(&'static str, &'static str)]| vec![headers(extra, false), frame(DATA, END_STREAM, 1, body)];
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("uppercase header name", with_body(&[("X-Session-Id", "a")])),
        ("connection header", with_body(&[("connection", "keep-alive")])),
        (
            "transfer-encoding header",
            with_body(&[("transfer-encoding", "chunked")]),
        ),
        ("keep-alive header", with_body(&[("keep-alive", "timeout=5")])),
        ("upgrade header", with_body(&[("upgrade", "h2c")])),
        ("te other than trailers", with_body(&[("te", "gzip")])),
        ("pseudo-header after a regular one", {
            let mut f = request_fields(&[]);
            f.push((":status", "200"));
            vec![
                frame(HEADERS, END_HEADERS, 1, &hpack(&f)),
                frame(DATA, END_STREAM, 1, body),
            ]
        }),
        ("no :path", {
            let f: Vec<_> = request_fields(&[]).into_iter().filter(|(k, _)| *k != ":path").collect();
            vec![
                frame(HEADERS, END_HEADERS, 1, &hpack(&f)),
                frame(DATA, END_STREAM, 1, body),
            ]
        }),
        ("duplicate :path", with_body(&[(":path", "/v1/embeddings")])),
        (
            "CR LF in a header value",
            with_body(&[("x-session-id", "a\r\nset-cookie: x=1")]),
        ),
        ("NUL in a header value", with_body(&[("x-session-id", "a\0b")])),
        (
            "content-length larger than the body",
            with_body(&[("content-length", "4096")]),
        ),
        (
            "content-length smaller than the body",
            with_body(&[("content-length", "5")]),
        ),
        (
            "two differing content-lengths",
            with_body(&[("content-length", "5"), ("content-length", "6")]),
        ),
        (
            "reset mid-body",
            vec![
                headers(&[], false),
                frame(DATA, 0, 1, &body[..20]),
                frame(RST_STREAM, 0, 1, &8u32.to_be_bytes()),
            ],
        ),
        ("CONTINUATION flood past the header limit", {
            // 1000 CONTINUATION frames of 200-byte fields, never ending the block: 200 KB against a 60 KiB limit.
            let filler = "f".repeat(190);
            let field = hpack(&[("x-flood", filler.as_str())]);
            let mut f = vec![frame(HEADERS, 0, 1, &hpack(&request_fields(&[])))];
            f.extend((0..1000).map(|_| frame(CONTINUATION, 0, 1, &field)));
            f
        }),
    ];
    // The frame writer itself is sound: a valid request with a long field (a multi-byte HPACK length) is answered
    // and routed, so the closures below are Envoy's verdict on the abuse, not on our encoding.
    let long: &'static str = "f".repeat(190).leak();
    let control = h2_exchange(&envoy, &with_body(&[("x-long", long)]), &[1]).await;
    assert_eq!(control.answered, vec![1], "{control:?}");
    assert_eq!(engine_posts(&fleet).len(), 1);
    fleet.reset();
    let mut failures = Vec::new();
    let protocol_errors = "http.llmroute.downstream_cx_protocol_error";
    for (name, frames) in &cases {
        let errors_before = envoy.stat(protocol_errors).await.unwrap_or(0);
        let got = h2_exchange(&envoy, frames, &[1]).await;
        let reset = got.resets.iter().any(|(s, _)| *s == 1) || got.goaway.is_some_and(|c| c != 0);
        // Envoy closes the whole connection on a malformed header block (stream_error_on_invalid_http_messaging
        // is off), and counts it as a protocol error.
        let closed = got.closed && envoy.stat(protocol_errors).await.unwrap_or(0) > errors_before;
        // A stream the client reset itself needs no answer; any other must be reset or its connection closed.
        let client_reset = *name == "reset mid-body";
        if !client_reset && !reset && !closed {
            failures.push(format!("{name}: neither reset nor closed as a protocol error: {got:?}"));
        }
        if !got.answered.is_empty() {
            failures.push(format!("{name}: answered instead of reset: {got:?}"));
        }
        let reached = engine_posts(&fleet);
        if !reached.is_empty() {
            failures.push(format!("{name}: {} request(s) reached an engine", reached.len()));
            fleet.reset();
        }
    }
    if !failures.is_empty() {
        eprintln!("{}", envoy.log());
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    let (status, _, _) = post(&h2_client(), &envoy, &chat(None, "after"), &[]).await;
    assert_eq!(status, 200);
    assert_wasm_healthy(&envoy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_max_concurrent_streams_with_partial_bodies_are_refused_and_reach_no_engine() {
    let (fleet, envoy) = setup(json!({"max_concurrent_streams": 8})).await;
    let body = BODY.as_bytes();
    // 40 streams at once, each with half a body and no end: the first 8 wait in the filter, the rest are refused.
    let streams: Vec<u32> = (0..40).map(|i| 1 + 2 * i).collect();
    let mut frames = Vec::new();
    for &id in &streams {
        frames.push(frame(HEADERS, END_HEADERS, id, &hpack(&request_fields(&[]))));
        frames.push(frame(DATA, 0, id, &body[..body.len() / 2]));
    }
    let over: Vec<u32> = streams[8..].to_vec();
    let got = h2_exchange(&envoy, &frames, &over).await;
    let refused: Vec<u32> = got
        .resets
        .iter()
        .filter(|(_, c)| *c == REFUSED_STREAM)
        .map(|(s, _)| *s)
        .collect();
    assert!(
        over.iter().all(|s| refused.contains(s)),
        "streams past the limit were not refused: {got:?}"
    );
    assert!(
        got.resets.iter().all(|(s, _)| over.contains(s)) && got.goaway.is_none(),
        "a stream within the limit was reset: {got:?}"
    );
    assert!(got.answered.is_empty(), "a partial body got an answer: {got:?}");
    assert!(engine_posts(&fleet).is_empty(), "a partial body reached an engine");
    // The connection is gone now; Envoy and the filter are fine.
    let (status, _, _) = post(&h2_client(), &envoy, &chat(None, "after"), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(engine_posts(&fleet).len(), 1);
    assert_wasm_healthy(&envoy).await;
}
