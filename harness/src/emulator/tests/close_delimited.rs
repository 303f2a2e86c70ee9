//! Close-delimited streams, read over a raw socket: an `HTTP/1.0` head with `connection: close`, neither
//! `content-length` nor `transfer-encoding`, and a body that ends when the emulator closes the connection.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::dialects::request;
use super::faults::{fresh_stream, streaming};
use crate::emulator::{Dialect, Emulator};

/// A response as read off the socket until the server closed it.
struct Raw {
    head: String,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// Sends one streamed request as HTTP/1.1 and reads until the server closes the connection.
async fn raw_stream(emulator: &Emulator, dialect: Dialect, headers: &[(&str, &str)]) -> Raw {
    emulator.reset();
    let body = request(dialect, "stream me", true).to_string();
    let mut head = format!(
        "POST {} HTTP/1.1\r\nhost: emulator\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        dialect.path(),
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let mut socket = TcpStream::connect(emulator.addr()).await.unwrap();
    socket.write_all(format!("{head}\r\n{body}").as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut response)).await;
    read.expect("the server should close the connection").unwrap();
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    Raw {
        head: String::from_utf8(response[..split].to_vec()).unwrap(),
        body: response[split + 4..].to_vec(),
    }
}

fn assert_close_delimited(raw: &Raw) {
    assert!(raw.head.starts_with("HTTP/1.0 200 OK\r\n"), "{}", raw.head);
    assert_eq!(raw.header("connection"), Some("close"), "{}", raw.head);
    assert_eq!(raw.header("content-type"), Some("text/event-stream"));
    assert_eq!(raw.header("content-length"), None, "{}", raw.head);
    assert_eq!(raw.header("transfer-encoding"), None, "{}", raw.head);
}

#[tokio::test]
async fn the_header_sends_every_stream_close_delimited() {
    let emulator = Emulator::spawn("close").await.unwrap();
    for dialect in streaming() {
        let chunked = fresh_stream(&emulator, dialect, &[]).await.bytes;
        let raw = raw_stream(&emulator, dialect, &[("x-emu-close-delimited", "1")]).await;
        assert_close_delimited(&raw);
        assert_eq!(raw.body, chunked, "{dialect:?}: the same bytes, unframed");
        let plain = raw_stream(&emulator, dialect, &[("connection", "close")]).await;
        assert_eq!(plain.header("transfer-encoding"), Some("chunked"), "without the header");
    }
}

#[tokio::test]
async fn a_close_delimited_emulator_combines_with_the_stream_faults() {
    let emulator = Emulator::spawn_close_delimited("closing").await.unwrap();
    let whole = raw_stream(&emulator, Dialect::Chat, &[]).await;
    assert_close_delimited(&whole);
    let whole = String::from_utf8(whole.body).unwrap();
    assert!(whole.ends_with("data: [DONE]\n\n"), "{whole}");

    let no_terminal = raw_stream(&emulator, Dialect::Chat, &[("x-emu-no-terminal", "1")]).await;
    assert_close_delimited(&no_terminal);
    assert_eq!(
        String::from_utf8(no_terminal.body).unwrap(),
        whole.strip_suffix("data: [DONE]\n\n").unwrap()
    );

    // A cut closes the connection, which is also how a close-delimited body ends cleanly.
    let cut = raw_stream(&emulator, Dialect::Chat, &[("x-emu-cut-after", "1")]).await;
    let cut = String::from_utf8(cut.body).unwrap();
    assert!(whole.starts_with(&cut));
    assert!(cut.contains("tok0 ") && !cut.contains("tok1 "), "{cut}");
    assert!(cut.ends_with("\n\n"));

    let mid = raw_stream(&emulator, Dialect::Messages, &[("x-emu-cut-mid", "1")]).await;
    assert!(!mid.body.ends_with(b"\n"));

    // reqwest reads such a body to its end like any other.
    let response = super::dialects::post(&emulator, Dialect::Chat, &request(Dialect::Chat, "x", true), &[]).await;
    assert_eq!(response.version(), reqwest::Version::HTTP_10);
    assert!(response.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    assert_eq!(emulator.inflight(), 0);
}
