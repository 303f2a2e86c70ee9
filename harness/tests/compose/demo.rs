//! The demo stack, `envoy/docker-compose.yaml`, as users start it (`make compose-up`), with the local images:
//! three llama-servers behind one Envoy with the filter, and Prometheus.
//!
//! - Chats through Envoy's published port reach every engine.
//! - One engine's container killed under traffic: no request fails (Envoy retries the tries it held, its health
//!   checks take it out); started again, it serves again (Envoy follows its name to its new address).
//! - One engine cut off the network under traffic: Envoy takes it out, and no request fails (a try stuck on it is
//!   retried after the config's 30 s per-try timeout).
//! - `down --volumes` leaves no container, network or volume.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::*;

const FILE: &str = "envoy/docker-compose.yaml";
const BACKEND: &str = "llama-a";
const NETWORK: &str = "llmroute";
const ENGINES: [&str; 3] = ["llama-a-0", "llama-a-1", "llama-a-2"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_stack_serves_from_every_engine_and_fails_no_request_when_one_is_killed_or_cut_off() {
    let stack = start(FILE, "demo");
    let envoy = Envoy::of(&stack, "envoy");
    envoy.wait_ready(Duration::from_secs(120)).await;
    envoy.wait_healthy(BACKEND, 3, Duration::from_secs(120)).await;

    // Every engine serves: distinct keys until each has answered.
    let c = client();
    let mut served = BTreeSet::new();
    for key in keys("demo", 60) {
        let a = envoy.chat(&c, &key).await;
        assert!(a.ok(), "{key}: {a:?}");
        served.insert(a.engine);
        if served.len() == ENGINES.len() {
            break;
        }
    }
    assert_eq!(served, ENGINES.map(String::from).into(), "every engine serves");
    println!("every engine served: {served:?}");

    // One engine killed, then started again.
    let traffic = Traffic::start(std::slice::from_ref(&envoy), &keys("kill", 24), 2);
    traffic.more(Instant::now(), 10).await;
    let ip = stack.ip("llama-a-1", NETWORK).unwrap_or_else(|e| panic!("{e}"));
    stack.kill(&["llama-a-1"]).unwrap_or_else(|e| panic!("{e}"));
    let killed = Instant::now();
    let out = out_of_rotation(&envoy, &ip, "killed").await;
    traffic.more(Instant::now(), 10).await;
    stack.start("llama-a-1").unwrap_or_else(|e| panic!("{e}"));
    let restarted = Instant::now();
    let back = traffic
        .wait("the restarted engine serving", Duration::from_secs(90), |s| {
            s.iter().any(|x| x.at >= restarted && x.answer.engine == "llama-a-1")
        })
        .await;
    let sent = traffic.stop().await;
    let after_kill = sent.iter().filter(|s| s.at >= killed).count();
    println!(
        "killed llama-a-1: out of Envoy's rotation in {out:?}, serving again {back:?} after its start; {} requests \
         ({after_kill} after the kill), {} failed; per engine {:?}",
        sent.len(),
        failures(&sent).len(),
        per_engine(&sent)
    );
    assert_eq!(failures(&sent), Vec::<String>::new(), "no request fails");

    // One engine cut off the network.
    let traffic = Traffic::start(std::slice::from_ref(&envoy), &keys("cut", 24), 2);
    traffic.more(Instant::now(), 10).await;
    let ip = stack.ip("llama-a-2", NETWORK).unwrap_or_else(|e| panic!("{e}"));
    let retries_before = envoy.stat(&format!("cluster.{BACKEND}.upstream_rq_retry")).await;
    stack.disconnect("llama-a-2", NETWORK).unwrap_or_else(|e| panic!("{e}"));
    let cut = Instant::now();
    let ejected = out_of_rotation(&envoy, &ip, "cut-off").await;
    traffic.more(Instant::now(), 20).await;
    let sent = traffic.stop().await;
    let retries = envoy.stat(&format!("cluster.{BACKEND}.upstream_rq_retry")).await - retries_before;
    let late: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.at >= cut + ejected && s.answer.engine == "llama-a-2")
        .collect();
    println!(
        "cut off llama-a-2: out of Envoy's rotation in {ejected:?}; {} requests, {} failed, {retries} retried; per \
         engine {:?}",
        sent.len(),
        failures(&sent).len(),
        per_engine(&sent)
    );
    assert_eq!(failures(&sent), Vec::<String>::new(), "no request fails");
    assert!(late.is_empty(), "answers from the cut-off engine: {late:?}");

    take_down(stack);
}

/// How long until Envoy's rotation of the backend holds no host at `ip`, the `what` engine's address; at most 30 s.
async fn out_of_rotation(envoy: &Envoy, ip: &str, what: &str) -> Duration {
    wait_for(Duration::from_secs(30), || async {
        !envoy
            .healthy(BACKEND)
            .await
            .iter()
            .any(|h| h.starts_with(&format!("{ip}:")))
    })
    .await
    .unwrap_or_else(|| panic!("the {what} engine stayed in Envoy's rotation for 30 s"))
}
