//! The allocation budget of one request in the core: exact heap allocations and bytes allocated by `route` and by
//! the head edit the filter sends to Envoy, for the overhead bench's chat bodies (4 KiB and 256 KiB). It counts,
//! it does not time, so it holds on any machine. When a change adds an allocation this fails; when a change
//! saves one, lower the budget here (and say so in the commit).
//!
//! The counting allocator (`tests/alloc_counter/`) keeps per-thread counters, so other tests and the harness's own
//! threads do not disturb the count.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod alloc_counter;

use alloc_counter::{counted, Counting};
use llmroute_core::{load_config, route, Api, Config};
use llmroute_synth::body;

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The overhead bench's config: the alias is rewritten to another model name; `same` is not.
fn config() -> Config {
    let doc = serde_json::json!({
        "version": 1,
        "backends": [{ "name": "bench", "kind": "llamacpp", "endpoints": ["127.0.0.1:8081"] }],
        "models": [
            { "name": body::ALIAS, "routes": [{ "backend": "bench", "upstream_model": body::UPSTREAM_MODEL }] },
            { "name": "same", "routes": [{ "backend": "bench" }] },
        ],
    });
    load_config(&doc.to_string()).unwrap()
}

/// What one request costs: `route`, then the head edit when there is a patch.
#[derive(Debug, PartialEq, Eq)]
struct Cost {
    route_allocs: u64,
    route_bytes: u64,
    edit_allocs: u64,
    edit_bytes: u64,
}

fn cost(cfg: &Config, body: &[u8]) -> Cost {
    let (route_allocs, route_bytes, decision) = counted(|| route(cfg, Api::Chat, body, None));
    let decision = decision.unwrap();
    let (edit_allocs, edit_bytes, _) = counted(|| decision.patch.as_ref().map(|p| p.head_edit(body).map(|c| c.len())));
    Cost {
        route_allocs,
        route_bytes,
        edit_allocs,
        edit_bytes,
    }
}

/// The budget: the same at every body size, since nothing in the core copies the body. (`route` allocates the
/// scanner's stack of open containers, the top-level members, the alias, cluster and upstream model names and,
/// for a rewrite, the new `model` value; the head edit borrows.)
const REWRITTEN: Cost = Cost {
    route_allocs: 7,
    route_bytes: 293,
    edit_allocs: 0,
    edit_bytes: 0,
};

/// An alias named after its model: no patch, no new `model` value.
const UNTOUCHED: Cost = Cost {
    route_allocs: 6,
    route_bytes: 269,
    edit_allocs: 0,
    edit_bytes: 0,
};

#[test]
fn a_request_allocates_within_its_budget_at_every_size() {
    let cfg = config();
    for size in [4 << 10, 256 << 10] {
        let rewritten = body::chat_body(size, 0, 42);
        let label = body::size_label(size);
        // Once to warm anything lazily initialised, then counted.
        cost(&cfg, &rewritten);
        assert_eq!(cost(&cfg, &rewritten), REWRITTEN, "{label}, model rewritten");
        let same = String::from_utf8(rewritten)
            .unwrap()
            .replacen(&format!("\"{}\"", body::ALIAS), "\"same\"", 1);
        assert_eq!(cost(&cfg, same.as_bytes()), UNTOUCHED, "{label}, model unchanged");
    }
}

/// The response path's reads: a JSON answer's usage (once per answer) and one chat stream delta (once per event),
/// building only the members the filter reads. Whole-document parses of the same texts took 31 and 20.
#[test]
fn the_response_path_reads_allocate_within_their_budget() {
    use llmroute_core::stream::usage;
    let answer = include_str!("../benches/response_answer.json").trim();
    let event = include_str!("../benches/response_event.json").trim();
    let keep = ["type", "error", "usage", "timings", "message", "response"];
    usage::of_document(answer);
    let (answer_allocs, _, read) = counted(|| usage::of_document(answer));
    assert_eq!(read.and_then(|u| u.prompt_tokens), Some(1024));
    let (event_allocs, _, doc) = counted(|| usage::parse_members(event, &keep, &["choices"]));
    assert!(doc.is_some());
    assert_eq!((answer_allocs, event_allocs), (12, 6), "answer, event");
}
