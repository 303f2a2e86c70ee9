//! `llmroute-probe http://IP:PORT/PATH`: exits 0 when the URL answers a 2xx within 2 s, else 1, printing one
//! line either way (Docker keeps it as the health check's output). `llmroute-probe file:///PATH`: exits 0 when
//! the file exists and is not empty. Usage errors exit 2.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Duration;

use llmroute_container_tools::probe;

const TIMEOUT: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url] = args.as_slice() else {
        eprintln!(
            "usage: llmroute-probe http://IP:PORT/PATH (exit 0 on a 2xx answer within 2 s) | file:///PATH (exit 0 \
             when the file is there and not empty)"
        );
        return ExitCode::from(2);
    };
    let target = match probe::parse(url) {
        Ok(probe::Check::Http(t)) => t,
        Ok(probe::Check::File(path)) => return check_file(url, &path),
        Err(e) => {
            eprintln!("llmroute-probe: {e}");
            return ExitCode::from(2);
        }
    };
    match check(&target) {
        Ok(status) if probe::healthy(status) => {
            println!("{url}: {status}");
            ExitCode::SUCCESS
        }
        Ok(status) => {
            println!("{url}: {status}, not 2xx");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("{url}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check_file(url: &str, path: &std::path::Path) -> ExitCode {
    let found = std::fs::metadata(path)
        .map_err(|e| e.to_string())
        .and_then(|m| probe::file_healthy(m.is_file(), m.len()));
    match found {
        Ok(()) => {
            println!("{url}: there");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{url}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check(target: &probe::Target) -> Result<u16, String> {
    let mut stream = TcpStream::connect_timeout(&target.addr, TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    stream
        .write_all(probe::request(target).as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    // The status line fits in the first bytes; read until a line end, the close, or 512 bytes.
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while head.len() < 512 && !head.contains(&b'\n') {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(buf.get(..n).unwrap_or(&[])),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    probe::status(&head)
}
