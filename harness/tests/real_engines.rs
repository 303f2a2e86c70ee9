//! llmroute in front of real llama.cpp `llama-server` processes (`make engines`), in a real Envoy with the real
//! filter. Part of `make test`: a missing or broken engine fails these tests, they never skip.
//!
//! Every server runs the tiny random-weight model with `-np 2 -cram 0` (two slots, no host-RAM prompt cache), so
//! a prompt prefix is warm only in the slot that last served it, and every server answers with `model` equal to
//! its `--alias` (`llama-a-0`, `llama-a-1`, ...): that is how each request's server is identified.
//!
//! - `sdks_stream_through_envoy_to_llama_server`: the openai and anthropic SDKs, chat and messages, streamed
//!   and not (`tests/sdk/check_real_sdks.py`); the fleet check runs on the identical fleet and warns of nothing.
//! - `shared_system_prompts_hit_the_owner_cache_more_than_least_request`: 4 tenants with ~600-word system
//!   prompts, 24 streamed requests in a seeded order at concurrency 2, once through chwbl and once through
//!   least_request, each on a fresh fleet. Repeats land on the tenant's owner and hit its cache; the
//!   engine-reported cache-hit ratio of chwbl beats least_request's. Only the ordering is asserted.
//! - `a_killed_server_is_routed_around_and_a_loading_one_waits_until_ready`: SIGKILL one server mid-run (every
//!   request sent after the kill succeeds), then restart it on its port with a model that takes about a second to
//!   load: while its `/health` answers 503, Envoy flags it failed and sends it nothing (its `rq_total` does not
//!   move, no upstream 503 ever), and once ready it serves again.
//! - `the_props_fleet_check_warns_about_servers_started_differently`: `-c` and `-np` differ across a backend.
//! - `a_rebuilt_answer_matches_llama_servers_own_non_streamed_answer`: the same greedy request to a
//!   `stream_upstream: always` alias and to an `as_sent` one: equal but for `id`, `created` and the durations in
//!   `timings` (and key order, which is not compared).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llmroute_harness::envoy::{repo_root, Envoy};
use llmroute_harness::gguf::tiny::TinyLlama;
use llmroute_harness::gguf::Gguf;
use llmroute_harness::llama::workload::{
    cache_hit_ratio, chat_body, client, prompt_text, run_jobs, stream_chat, tenant_system_prompt, ChatOutcome, Job,
};
use llmroute_harness::llama::{vocab, LlamaFleet, LlamaServer};
use llmroute_harness::sdk_clients;
use serde_json::{json, Value};

const ALIAS: &str = "local-chat";
const BACKEND: &str = "llama-a";
const WARNINGS: &str = "wasmcustom.llmroute_fleet_warnings_total";
const CHECKS: &str = "wasmcustom.llmroute_fleet_checks_total";

async fn fleet(n: usize) -> LlamaFleet {
    LlamaFleet::start(BACKEND, n, |_, _| {})
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn envoy(config: Value) -> Envoy {
    Envoy::start(config).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Polls Envoy's stat `name` until it reaches `at_least`; returns its value.
async fn wait_for_stat(envoy: &Envoy, name: &str, at_least: u64, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        let value = envoy.stat(name).await.unwrap_or(0);
        if value >= at_least {
            return value;
        }
        assert!(Instant::now() < deadline, "{name} stayed at {value} for {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn python() -> PathBuf {
    sdk_clients::python().unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdks_stream_through_envoy_to_llama_server() {
    python(); // fail fast, before starting anything
    let fleet = fleet(3).await;
    let envoy = envoy(fleet.config(ALIAS, "chwbl")).await;
    let servers: Vec<&str> = fleet.servers.iter().map(|s| s.alias()).collect();
    let script = repo_root().join("harness/tests/sdk/check_real_sdks.py");
    let mut command = sdk_clients::script_command(&script).unwrap_or_else(|e| panic!("{e}"));
    command.args([
        "--base-url",
        &envoy.url(""),
        "--model",
        ALIAS,
        "--servers",
        &servers.join(","),
    ]);
    let output: Output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the SDK checks finish within 2 minutes")
        .expect("running the SDK checks");
    let report = String::from_utf8_lossy(&output.stdout);
    println!("{report}");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the SDK checks failed:\n{report}");
    assert!(
        report.contains("ok chat-stream-again") && report.contains("ok messages-stream"),
        "{report}"
    );

    // The fleet check ran on this identical fleet and found nothing.
    let checks = wait_for_stat(&envoy, CHECKS, 1, Duration::from_secs(15)).await;
    assert_eq!(envoy.stat(WARNINGS).await, Some(0), "{}", envoy.log());
    println!("fleet check: {checks} check(s) of an identical fleet, 0 warnings");
}

/// One tenant's request: its system prompt, a question of its own, 4 tokens out.
fn tenant_job(tenant: usize, question: usize) -> Job {
    let system = tenant_system_prompt(tenant, 600);
    let user = format!("Question {question}: {}", prompt_text(question as u64, 12));
    Job {
        body: chat_body(ALIAS, &system, &user, 4),
        headers: Vec::new(),
    }
}

/// 4 tenants × 6 requests in a seeded random order in which no tenant comes twice in a row: at concurrency 2
/// the two requests in flight are then always of different tenants, so neither evicts the prefix the other
/// needs. `(tenant, job)`.
fn tenant_workload() -> Vec<(usize, Job)> {
    const TENANTS: usize = 4;
    const EACH: usize = 6;
    let mut x: u64 = 0x5eed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let order = loop {
        let mut left = [EACH; TENANTS];
        let mut order: Vec<usize> = Vec::new();
        while order.len() < TENANTS * EACH {
            let candidates: Vec<usize> = (0..TENANTS)
                .filter(|&t| left[t] > 0 && order.last() != Some(&t))
                .collect();
            if candidates.is_empty() {
                break; // a dead end: draw again
            }
            let t = candidates[(next() % candidates.len() as u64) as usize];
            left[t] -= 1;
            order.push(t);
        }
        if order.len() == TENANTS * EACH {
            break order;
        }
    };
    order.iter().enumerate().map(|(i, &t)| (t, tenant_job(t, i))).collect()
}

struct PolicyRun {
    outcomes: Vec<(usize, ChatOutcome)>,
    ratio: f64,
}

/// `lb` is an llmroute `lb` value, or `bounded_keys` for `chwbl` with `affinity.placement: bounded_keys`.
async fn run_policy(lb: &str) -> PolicyRun {
    let fleet = fleet(3).await;
    let bounded = lb == "bounded_keys";
    let mut config = fleet.config(ALIAS, if bounded { "chwbl" } else { lb });
    if bounded {
        config["affinity"]["placement"] = "bounded_keys".into();
    }
    if lb == "chwbl" || bounded {
        // With 2 requests in flight over 3 servers, the default bound (150 % of the mean load, i.e. one
        // request) sends the second of two tenants sharing an owner elsewhere; 200 % lets the owner take both.
        config["backends"][0]["balance_factor"] = 200.into();
    }
    let envoy = envoy(config).await;
    // Placement must see all three servers up before the first tenant arrives, or (on a loaded machine, where a
    // first health check can be slow) it places the early tenants on the servers that are.
    envoy
        .wait_snapshot_healthy(BACKEND, 3, Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let workload = tenant_workload();
    let tenants: Vec<usize> = workload.iter().map(|(t, _)| *t).collect();
    let jobs = workload.into_iter().map(|(_, j)| j).collect();
    let outcomes = run_jobs(&client(), &envoy.url("/v1/chat/completions"), jobs, 2).await;
    for o in &outcomes {
        assert!(o.ok, "{lb}: a request failed: {o:?}");
        assert!(fleet.index_of(&o.model).is_some(), "{lb}: unknown server {}", o.model);
        assert_eq!(
            o.cache_n,
            Some(o.cached_tokens),
            "timings.cache_n and cached_tokens agree: {o:?}"
        );
    }
    let ratio = cache_hit_ratio(&outcomes);
    let per_server: BTreeMap<&str, usize> = outcomes.iter().fold(BTreeMap::new(), |mut m, o| {
        *m.entry(o.model.as_str()).or_default() += 1;
        m
    });
    println!("{lb}: cache-hit ratio {ratio:.3} (cached / prompt tokens), requests per server {per_server:?}");
    for (i, (t, o)) in tenants.iter().zip(&outcomes).enumerate() {
        println!(
            "  {lb} #{i:02} tenant {t} -> {} prompt {} cached {}",
            o.model, o.prompt_tokens, o.cached_tokens
        );
    }
    PolicyRun {
        outcomes: tenants.into_iter().zip(outcomes).collect(),
        ratio,
    }
}

/// The first server each tenant's request reached, and how the repeats fared there:
/// `(owners, repeats, repeats on the owner, of those with over half the prompt cached)`.
fn owners(run: &PolicyRun) -> (BTreeMap<usize, String>, usize, usize, usize) {
    let mut owner: BTreeMap<usize, String> = BTreeMap::new();
    let (mut repeats, mut on_owner, mut warm_on_owner) = (0, 0, 0);
    for (tenant, o) in &run.outcomes {
        match owner.get(tenant) {
            None => {
                owner.insert(*tenant, o.model.clone());
            }
            Some(first) => {
                repeats += 1;
                if *first == o.model {
                    on_owner += 1;
                    if o.cached_tokens * 2 > o.prompt_tokens {
                        warm_on_owner += 1;
                    }
                }
            }
        }
    }
    (owner, repeats, on_owner, warm_on_owner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_system_prompts_stick_and_bounded_keys_hit_the_cache_more_than_least_request() {
    let chwbl = run_policy("chwbl").await;
    let bounded = run_policy("bounded_keys").await;
    let least = run_policy("least_request").await;

    // Keyed, each tenant's first request picks its owner and its repeats go there. With the ring alone the owners
    // are wherever the random ports hash: all 4 tenants may share one server's 2 slots and evict each other, so
    // warmth is only printed for chwbl. Bounded-keys placement puts at most 2 tenants on a server, so the
    // repeats must find their prompt warm.
    for (name, run) in [("chwbl", &chwbl), ("bounded_keys", &bounded)] {
        let (owner, repeats, on_owner, warm) = owners(run);
        println!(
            "{name} owners {owner:?}: {on_owner}/{repeats} repeats on the owner, {warm} of them with over half \
             their prompt cached; cache-hit ratio {:.3} vs least_request {:.3}",
            run.ratio, least.ratio
        );
        assert!(
            on_owner * 4 >= repeats * 3,
            "{name}: at least 3/4 of the repeats on the owner: {on_owner}/{repeats}"
        );
    }
    let (owner, _, on_owner, warm) = owners(&bounded);
    let mut per_server: BTreeMap<&String, usize> = BTreeMap::new();
    for o in owner.values() {
        *per_server.entry(o).or_default() += 1;
    }
    assert!(per_server.values().all(|n| *n <= 2), "bounded_keys owners: {owner:?}");
    assert!(
        warm * 2 >= on_owner,
        "most owner repeats hit its cache: {warm}/{on_owner}"
    );
    assert!(
        bounded.ratio > least.ratio,
        "bounded_keys's engine-reported cache-hit ratio {:.3} beats least_request's {:.3}",
        bounded.ratio,
        least.ratio
    );
}

/// `HOST:PORT`'s stat `name` in Envoy's admin `/clusters` (text), e.g. `rq_total`.
async fn host_stat(envoy: &Envoy, cluster: &str, host: &str, name: &str) -> u64 {
    let text = reqwest::get(envoy.admin_url("/clusters"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let key = format!("{cluster}::{host}::{name}::");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A llama model that takes about a second to load (400 thin blocks; 0.8-1.5 s here), so the restarted server's
/// `/health` answers 503 long enough for Envoy's 500 ms health checks to see it. The tiny model loads in about
/// 0.35 s, too fast for that.
fn slow_loading_model(dir: &std::path::Path) -> PathBuf {
    let model = TinyLlama {
        embd: 64,
        layers: 400,
        ff: 128,
        heads: 2,
        ctx: 1024,
        seed: 7,
        f16: true,
    };
    let vocab = Gguf::read_file(&vocab()).unwrap_or_else(|e| panic!("{e}: run `make engines`"));
    let path = dir.join("slow-load.gguf");
    model.build(&vocab).unwrap().write_file(&path).unwrap();
    path
}

/// Sends distinct short requests (no system prompt, so the key is the user prefix and they spread over the
/// servers) at concurrency 2 until `stop`; returns `(seconds since t0 when sent, outcome)`.
fn background_traffic(
    url: String,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(f64, ChatOutcome)>> {
    tokio::spawn(async move {
        let c = client();
        let mut all = Vec::new();
        let mut n = 1000u64;
        while !stop.load(Ordering::SeqCst) {
            let a = spread_job(n);
            let b = spread_job(n + 1);
            n += 2;
            let sent = t0.elapsed().as_secs_f64();
            let (x, y) = tokio::join!(
                stream_chat(&c, &url, &a.body, &a.headers),
                stream_chat(&c, &url, &b.body, &b.headers)
            );
            all.push((sent, x));
            all.push((sent, y));
        }
        all
    })
}

fn spread_job(n: u64) -> Job {
    let body = json!({
        "model": ALIAS,
        "messages": [{ "role": "user", "content": format!("{n} {}", prompt_text(n, 30)) }],
        "max_tokens": 4,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    Job {
        body,
        headers: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_routed_around_and_a_loading_one_waits_until_ready() {
    let dir = tempfile::tempdir().unwrap();
    let slow_model = slow_loading_model(dir.path());
    let mut fleet = fleet(3).await;
    let mut config = fleet.config(ALIAS, "chwbl");
    config["backends"][0]["health"] = json!({ "interval_ms": 500, "unhealthy": 2, "healthy": 1 });
    config["backends"][0]["outlier"] = json!({ "consecutive_5xx": 3, "base_ejection_ms": 1000 });
    let envoy = envoy(config).await;
    let url = envoy.url("/v1/chat/completions");
    let victim = 1;
    let victim_alias = fleet.servers[victim].alias().to_string();
    let victim_host = fleet.servers[victim].endpoint();
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = background_traffic(url, t0, stop.clone());

    // Until the victim has answered some requests.
    let deadline = Instant::now() + Duration::from_secs(30);
    while host_stat(&envoy, BACKEND, &victim_host, "rq_success").await < 3 {
        assert!(Instant::now() < deadline, "{victim_alias} got no traffic");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed_at = t0.elapsed().as_secs_f64();
    fleet.servers[victim].kill();
    println!("killed {victim_alias} ({victim_host}) at {killed_at:.2} s");
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Restart it on its port with a slow-loading model; watch its /health and Envoy's view of it meanwhile.
    let mut opts = fleet.servers[victim].options().clone();
    opts.model = slow_model;
    opts.ctx = 1024;
    let port = fleet.servers[victim].port();
    let restarted_at = t0.elapsed().as_secs_f64();
    let mut restarted = LlamaServer::spawn(&opts, port).unwrap();
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let mut loading: Vec<(f64, String, u64)> = Vec::new(); // (t, Envoy's flags, rq_total) at each 503 seen
    let ready_at = loop {
        let status = probe
            .get(restarted.url("/health"))
            .send()
            .await
            .map(|r| r.status().as_u16());
        let t = t0.elapsed().as_secs_f64();
        match status {
            Ok(200) => break t,
            Ok(503) => {
                let flags = envoy
                    .host_health(BACKEND)
                    .await
                    .get(&victim_host)
                    .cloned()
                    .unwrap_or_default();
                let rq_total = host_stat(&envoy, BACKEND, &victim_host, "rq_total").await;
                loading.push((t, flags, rq_total));
            }
            _ => {}
        }
        assert!(
            t - restarted_at < 60.0,
            "the restarted server never became ready:\n{}",
            restarted.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    restarted.wait_healthy(Duration::from_secs(5)).await.unwrap();
    // Traffic until the restarted server has answered again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let back_from = host_stat(&envoy, BACKEND, &victim_host, "rq_success").await;
    while host_stat(&envoy, BACKEND, &victim_host, "rq_success").await < back_from + 2 {
        assert!(
            Instant::now() < deadline,
            "the restarted server got no traffic after it was ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let outcomes = traffic.await.unwrap();

    let after_kill: Vec<&(f64, ChatOutcome)> = outcomes.iter().filter(|(t, _)| *t > killed_at).collect();
    let failed: Vec<&(f64, ChatOutcome)> = after_kill.iter().copied().filter(|(_, o)| !o.ok).collect();
    let by_victim_before_ready = after_kill
        .iter()
        .filter(|(t, o)| o.model == victim_alias && *t < restarted_at)
        .count();
    let by_victim_after = outcomes
        .iter()
        .filter(|(t, o)| o.model == victim_alias && *t > restarted_at)
        .count();
    let rq_503 = envoy
        .stat(&format!("cluster.{BACKEND}.upstream_rq_503"))
        .await
        .unwrap_or(0);
    let retries = envoy
        .stat(&format!("cluster.{BACKEND}.upstream_rq_retry"))
        .await
        .unwrap_or(0);
    println!(
        "{} requests in all, {} sent after the kill, {} of them failed; {retries} retries; restarted at \
         {restarted_at:.2} s, /health 503 seen {} times over {:.2} s, ready at {ready_at:.2} s; Envoy's flags while \
         loading: {:?}; upstream 503s: {rq_503}; answered by the restarted server: {by_victim_after}",
        outcomes.len(),
        after_kill.len(),
        failed.len(),
        loading.len(),
        loading.last().map_or(0.0, |l| l.0) - loading.first().map_or(0.0, |l| l.0),
        loading
            .iter()
            .map(|l| l.1.as_str())
            .collect::<std::collections::BTreeSet<_>>(),
    );
    assert!(!after_kill.is_empty());
    assert!(failed.is_empty(), "requests sent after the kill failed: {failed:?}");
    assert_eq!(by_victim_before_ready, 0, "the killed server answered after its kill");
    assert!(
        !loading.is_empty(),
        "the restarted server's /health never answered 503 while loading"
    );
    for (t, flags, _) in &loading {
        assert_ne!(flags, "healthy", "Envoy counted the loading server healthy at {t:.2} s");
    }
    let (first, last) = (loading[0].2, loading[loading.len() - 1].2);
    assert_eq!(
        first, last,
        "requests reached the server while its /health said 503 (rq_total {first} -> {last})"
    );
    assert_eq!(
        rq_503, 0,
        "no request was ever answered 503 (a loading llama-server answers 503)"
    );
    assert!(by_victim_after >= 1, "the restarted server serves again once ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_props_fleet_check_warns_about_servers_started_differently() {
    // -c 8192 -np 2: 4096 per slot, 2 slots (the majority on both figures); -c 4096 -np 1: 4096 per slot, 1 slot;
    // -c 4096 -np 2: 2048 per slot, 2 slots.
    let fleet = LlamaFleet::start(BACKEND, 3, |i, o| match i {
        1 => (o.ctx, o.parallel) = (4096, 1),
        2 => (o.ctx, o.parallel) = (4096, 2),
        _ => {}
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let envoy = envoy(fleet.config(ALIAS, "chwbl")).await;
    let started = Instant::now();
    let warnings = wait_for_stat(&envoy, WARNINGS, 2, Duration::from_secs(15)).await;
    let after = started.elapsed();
    // Envoy flushes its log to the file every 100 ms: wait for both lines.
    let deadline = Instant::now() + Duration::from_secs(5);
    let log = loop {
        let log = envoy.log();
        let found = |what: &str| log.lines().any(|l| l.contains("fleet check:") && l.contains(what));
        if found("disagree on n_ctx") && found("disagree on total_slots") {
            break log;
        }
        assert!(
            Instant::now() < deadline,
            "no fleet-check warnings in Envoy's log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("fleet check:")).collect();
    for l in &lines {
        println!("{l}");
    }
    let n_ctx = lines.iter().find(|l| l.contains("disagree on n_ctx")).unwrap();
    assert!(
        n_ctx.contains(&format!("2048 at {}", fleet.servers[2].endpoint())),
        "{n_ctx}"
    );
    let slots = lines.iter().find(|l| l.contains("disagree on total_slots")).unwrap();
    assert!(
        slots.contains(&format!("1 at {}", fleet.servers[1].endpoint())),
        "{slots}"
    );
    assert!(lines.iter().all(|l| l.contains("[warning]")), "{lines:?}");
    println!("llmroute_fleet_warnings_total = {warnings}, {after:?} after Envoy was ready");

    // Requests are routed as usual while the fleet is mismatched.
    let o = stream_chat(
        &client(),
        &envoy.url("/v1/chat/completions"),
        &chat_body(ALIAS, "Hi.", "Hello", 2),
        &[],
    )
    .await;
    assert!(o.ok, "{o:?}");
}

/// `stream_upstream: always` against a real llama-server: the answer the filter rebuilds from the stream is the
/// engine's own non-streamed answer, but for what is measured or drawn per request (see the test body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_answer_matches_llama_servers_own_non_streamed_answer() {
    let fleet = fleet(1).await;
    let server = fleet.servers[0].alias().to_string();
    let route = json!([{ "backend": fleet.backend, "upstream_model": server }]);
    let config = json!({
        "version": 1,
        "backends": [fleet.backend_entry("chwbl")],
        "models": [
            { "name": "plain", "routes": route },
            { "name": "always", "routes": route, "stream_upstream": "always" },
        ],
    });
    let envoy = envoy(config).await;
    let ask = |alias: &str| {
        json!({"model": alias, "temperature": 0, "seed": 7, "max_tokens": 12, "cache_prompt": false,
            "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to five."}]})
    };
    let c = client();
    let mut answers = Vec::new();
    for alias in ["plain", "always"] {
        let r = c
            .post(envoy.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(ask(alias).to_string())
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        println!("{alias}: {text}");
        assert_eq!(status, 200, "{alias}: {text}\n{}", envoy.log());
        answers.push(serde_json::from_str::<Value>(&text).unwrap());
    }
    let (plain, rebuilt) = (&answers[0], &answers[1]);
    let content = &rebuilt["choices"][0]["message"]["content"];
    assert!(content.as_str().is_some_and(|t| !t.is_empty()), "{rebuilt}");
    assert_eq!(rebuilt["usage"]["completion_tokens"], 12, "{rebuilt}");
    // Drawn or measured per request: `id` (random), `created` (the clock), and the durations in `timings`.
    let normalise = |v: &Value| {
        let mut v = v.clone();
        let o = v.as_object_mut().unwrap();
        o.remove("id");
        o.remove("created");
        if let Some(t) = o.get_mut("timings").and_then(Value::as_object_mut) {
            t.retain(|k, _| k.ends_with("_n"));
        }
        v
    };
    assert_eq!(normalise(rebuilt), normalise(plain));
}
