//! Criterion benches of the pure core over chat bodies from 1 KiB to 1 MiB, as throughput (`Throughput::Bytes`;
//! criterion prints MiB/s):
//! - `scan_object`: parse and validate the whole body (`json::scan_object`);
//! - `token_estimate`: the input-token estimate, a second pass over the body (`estimate::input_tokens`);
//! - `route_chat`: the whole decision for a chat body (`route` with `Api::Chat`): parse, validate, read fields,
//!   resolve the alias, extract and hash the affinity key, plan the `model` rewrite;
//! - `body_patch_apply`: apply that rewrite (`BodyPatch::apply`), one copy of the body;
//! - `response_read`: an answer's usage and a stream event read whole against only the members the filter reads;
//! - `messages_read`: the content key read from `messages` by walking against through the scan's message index.
//!
//! The bodies are the overhead bench's (`harness/src/bench/body.rs`, included below), so the figures compare.
//! Run with `make bench-micro` or `cargo bench -p llmroute-core --bench core`.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use llmroute_synth::body;

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use llmroute_core::estimate::input_tokens;
use llmroute_core::json::{scan_object, MAX_DEPTH};
use llmroute_core::{route, Api, BodyPatch, Config};

const SEED: u64 = 42;

/// One alias to one backend, rewritten to another model name, as in the overhead bench.
fn config() -> Config {
    let doc = serde_json::json!({
        "version": 1,
        "backends": [{ "name": "bench", "kind": "llamacpp", "endpoints": ["127.0.0.1:8081"] }],
        "models": [{ "name": body::ALIAS, "routes": [{ "backend": "bench", "upstream_model": body::UPSTREAM_MODEL }] }],
    });
    match llmroute_core::load_config(&doc.to_string()) {
        Ok(cfg) => cfg,
        Err(e) => unreachable!("the bench config is valid: {e}"),
    }
}

/// `(id, body)` for every size.
fn bodies() -> Vec<(String, Vec<u8>)> {
    body::SIZES
        .iter()
        .map(|&size| (body::size_id(size), body::chat_body(size, 0, SEED)))
        .collect()
}

fn bench_scan(c: &mut Criterion) {
    let mut group = c.benchmark_group("scan_object");
    for (id, body) in bodies() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(id), &body, |b, body| {
            b.iter(|| scan_object(black_box(body), MAX_DEPTH))
        });
    }
    group.finish();
}

fn bench_estimate(c: &mut Criterion) {
    let mut group = c.benchmark_group("token_estimate");
    for (id, body) in bodies() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(id), &body, |b, body| {
            b.iter(|| input_tokens(black_box(body), 0))
        });
    }
    group.finish();
}

fn bench_route(c: &mut Criterion) {
    let cfg = config();
    let mut group = c.benchmark_group("route_chat");
    for (id, body) in bodies() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(id), &body, |b, body| {
            b.iter(|| route(&cfg, Api::Chat, black_box(body), None))
        });
    }
    group.finish();
}

fn bench_patch(c: &mut Criterion) {
    let cfg = config();
    let mut group = c.benchmark_group("body_patch_apply");
    for (id, body) in bodies() {
        let Some(patch) = route(&cfg, Api::Chat, &body, None).ok().and_then(|d| d.patch) else {
            continue;
        };
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(id), &body, |b, body| {
            b.iter(|| BodyPatch::apply(black_box(&patch), black_box(body)))
        });
    }
    group.finish();
}

/// Bounded-keys placement as the filter runs it per request: decode the table from its shared-data bytes, choose,
/// encode it back. The cost grows with the live keys, so it is measured at several table sizes.
fn bench_placement(c: &mut Criterion) {
    use llmroute_core::config::BoundedKeys;
    use llmroute_core::key_placement::{choose, Bounds, HostView, KeyTable};
    let hosts: Vec<HostView> = (0..8)
        .map(|i| HostView {
            address: format!("10.0.0.{i}:8080"),
            up: true,
            weight: 1,
            in_flight: 0,
            queued: None,
        })
        .collect();
    let bounds = Bounds::new(&BoundedKeys::default(), 150);
    let mut group = c.benchmark_group("placement_per_request");
    for keys in [16u64, 256, 4096] {
        let mut table = KeyTable::default();
        for k in 0..keys {
            choose(&mut table, &hosts, k.wrapping_mul(0x9e37_79b9_7f4a_7c15), 1000, &bounds);
        }
        let bytes = table.encode();
        group.bench_with_input(BenchmarkId::from_parameter(keys), &bytes, |b, bytes| {
            b.iter(|| {
                let mut t = KeyTable::decode(black_box(bytes));
                let c = choose(&mut t, &hosts, black_box(0x9e37_79b9_7f4a_7c15), 2500, &bounds);
                black_box((c, t.encode()))
            })
        });
    }
    group.finish();
}

/// The response path's reads of an answer's usage and of a stream event: the whole document parsed against only
/// the members the filter reads. Inputs as in `alloc.rs`.
fn bench_response_reads(c: &mut Criterion) {
    use llmroute_core::stream::usage;
    let answer = include_str!("response_answer.json").trim();
    let event = include_str!("response_event.json").trim();
    let mut group = c.benchmark_group("response_read");
    group.bench_function("answer-whole", |b| {
        b.iter(|| usage::parse_doc(black_box(answer)).map(|d| usage::from_value(&d)))
    });
    group.bench_function("answer-kept", |b| b.iter(|| usage::of_document(black_box(answer))));
    let keep = ["type", "error", "usage", "timings", "message", "response"];
    group.bench_function("event-whole", |b| b.iter(|| usage::parse_doc(black_box(event))));
    group.bench_function("event-kept", |b| {
        b.iter(|| usage::parse_members(black_box(event), &keep, &["choices"]))
    });
    group.finish();
}

/// The content key read from `messages` after the scan: walking the array against reading the scan's message
/// index (`message_index`). The bench bodies write `content` before `role`, as serde_json does, so the walk steps
/// over the user message twice to learn its role.
fn bench_messages_read(c: &mut Criterion) {
    use llmroute_core::affinity::ContentKey;
    use llmroute_core::content::{feed_first_user, feed_leading};
    use llmroute_core::json::{nav, scan_object_with, Span};
    use llmroute_core::message_index::MessageIndex;
    fn key(body: &[u8], list: Span, index: Option<&MessageIndex<'_>>) -> bool {
        let mut system = ContentKey::system(body::ALIAS);
        feed_leading(body, list, index, &["system", "developer"], &mut system);
        if system.finish().is_some() {
            return true;
        }
        let mut user = ContentKey::user_prefix(body::ALIAS, 256);
        feed_first_user(body, list, index, &mut user) && user.finish().is_some()
    }
    let mut group = c.benchmark_group("messages_read");
    for (id, body) in bodies() {
        let mut index = MessageIndex::new(&body);
        let Ok(members) = scan_object_with(&body, MAX_DEPTH, &mut index) else {
            continue;
        };
        let Some(list) = members
            .iter()
            .find(|m| nav::str_value(&body, m.key).as_deref() == Some("messages"))
            .map(|m| m.value)
        else {
            continue;
        };
        group.bench_function(format!("{id}-walked"), |b| b.iter(|| key(black_box(&body), list, None)));
        group.bench_function(format!("{id}-indexed"), |b| {
            b.iter(|| key(black_box(&body), list, Some(&index)))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = bench_scan, bench_estimate, bench_route, bench_patch, bench_placement, bench_response_reads, bench_messages_read
}
criterion_main!(benches);
