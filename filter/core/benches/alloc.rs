//! Heap allocations per request in the core, counted by a counting global allocator, for chat bodies from 1 KiB
//! to 1 MiB. For each size it prints (and, with `LLMROUTE_BENCH_OUT=DIR`, writes to `DIR/alloc.md`) a table of:
//! - allocations and bytes allocated by `route` (the whole chat decision);
//! - allocations and bytes allocated by `BodyPatch::head_edit` (the `model` rewrite as the filter sends it);
//! - body bytes copied per request by the filter around the core: the host copies the body into the VM
//!   (`get_buffer`), and Envoy copies in what the head edit prepends (the replacement and the bytes before it).
//!
//! The exact counts are also a test that fails when they grow: `filter/core/tests/alloc_budget.rs`.
//!
//! Run with `make bench-micro` or `cargo bench -p llmroute-core --bench alloc`.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use llmroute_synth::body;

use std::fmt::Write;

use llmroute_core::{route, Api, RouteDecision};

#[path = "../tests/alloc_counter/mod.rs"]
mod alloc_counter;

use alloc_counter::{counted, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let doc = serde_json::json!({
        "version": 1,
        "backends": [{ "name": "bench", "kind": "llamacpp", "endpoints": ["127.0.0.1:8081"] }],
        "models": [{ "name": body::ALIAS, "routes": [{ "backend": "bench", "upstream_model": body::UPSTREAM_MODEL }] }],
    });
    let cfg = match llmroute_core::load_config(&doc.to_string()) {
        Ok(cfg) => cfg,
        Err(e) => return eprintln!("alloc bench: the bench config is invalid: {e}"),
    };
    let mut table = String::from(
        "| body | `route` allocations | `route` bytes allocated | head edit allocations | head edit bytes allocated | \
         body bytes copied per request in the filter |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for size in body::SIZES {
        let body = body::chat_body(size, 0, 42);
        let (allocs, bytes, decision) = counted(|| route(&cfg, Api::Chat, &body, None));
        let Ok(decision) = decision else {
            return eprintln!("alloc bench: the {} body was refused", body::size_label(size));
        };
        let (p_allocs, p_bytes) = patch_cost(&decision, &body);
        let prepended: usize = decision
            .patch
            .as_ref()
            .and_then(|p| p.head_edit(&body))
            .map_or(0, |calls| calls.iter().map(|c| c.bytes.len()).sum());
        let copied = body.len() + prepended;
        let _ = writeln!(
            table,
            "| {} | {allocs} | {bytes} | {p_allocs} | {p_bytes} | {copied} ({:.1}× the body) |",
            body::size_label(size),
            copied as f64 / body.len() as f64
        );
    }
    table.push_str(&response_path_table());
    print!("{table}");
    if let Some(dir) = std::env::var_os("LLMROUTE_BENCH_OUT") {
        let dir = std::path::PathBuf::from(dir);
        let written = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join("alloc.md"), &table));
        if let Err(e) = written {
            eprintln!("alloc bench: writing {}: {e}", dir.join("alloc.md").display());
        }
    }
}

/// A non-streamed chat answer of about 300 bytes, like the overhead bench's upstreams send.
pub const ANSWER: &str = include_str!("response_answer.json");
/// One content delta of a chat stream, the event a stream is mostly made of.
pub const DELTA_EVENT: &str = include_str!("response_event.json");

/// The response path's reads, side by side: the whole document parsed (as before issue 13's response-path
/// change) against only the members the filter reads (`usage::parse_members`, as it is now).
fn response_path_table() -> String {
    use llmroute_core::stream::usage;
    let mut t = String::from(
        "\n| response path read | whole document: allocations | bytes | kept members: allocations | bytes |\n\
         |---|---:|---:|---:|---:|\n",
    );
    let reads: [(&str, &str, &[&str], &[&str]); 2] = [
        (
            "usage of a ~300-byte JSON answer",
            ANSWER.trim(),
            &["timings", "usage"],
            &[],
        ),
        (
            "one chat stream delta event",
            DELTA_EVENT.trim(),
            &["type", "error", "usage", "timings", "message", "response"],
            &["choices"],
        ),
    ];
    for (what, text, keep, shape) in reads {
        let (w_allocs, w_bytes, _) = counted(|| usage::parse_doc(text).map(|d| usage::from_value(&d)));
        let (k_allocs, k_bytes, _) = counted(|| usage::parse_members(text, keep, shape));
        let _ = writeln!(t, "| {what} | {w_allocs} | {w_bytes} | {k_allocs} | {k_bytes} |");
    }
    t
}

fn patch_cost(decision: &RouteDecision, body: &[u8]) -> (u64, u64) {
    match &decision.patch {
        Some(patch) => {
            let (allocs, bytes, _) = counted(|| patch.head_edit(body).map(|c| c.len()));
            (allocs, bytes)
        }
        None => (0, 0),
    }
}
