//! `make demo`: three emulated llama.cpp engines behind a real Envoy running the llmroute filter.
//!
//! It starts everything, sends a few requests to show which backend answers which prompt family, prints curl
//! commands to try by hand, and stays up until Ctrl-C, then stops everything it started.

use std::time::Duration;

use llmroute_harness::emulator::{Emulator, EmulatorOptions};
use llmroute_harness::envoy::{Envoy, EnvoyOptions};
use serde_json::{json, Value};

/// The embedded default config (also shipped as `envoy/llmroute.yaml`).
const CONFIG: &str = include_str!("../../../envoy/llmroute.yaml");

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("demo: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let cfg = llmroute_core::load_config(CONFIG).map_err(|e| e.to_string())?;
    let mut engines = Vec::new();
    for (i, ep) in cfg.backends[0].endpoints.iter().enumerate() {
        let mut opts = EmulatorOptions::new(&format!("llama-a-{i}"));
        opts.model = "qwen3-0.6b".into();
        opts.chunk_delay_ms = 150;
        opts.port = ep.port;
        let engine = Emulator::spawn_with(opts)
            .await
            .map_err(|e| format!("cannot start the emulated engine on {ep}: {e}"))?;
        println!("engine  {} on {}", engine.name(), engine.addr());
        engines.push(engine);
    }
    let doc: Value =
        serde_json::from_str(&llmroute_harness::render::config_json(CONFIG)?).map_err(|e| e.to_string())?;
    let opts = EnvoyOptions {
        fixed_ports: true,
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(doc, opts).await?;
    println!(
        "envoy   listening on {} (admin {}), filter loaded\n",
        envoy.listen, envoy.admin
    );

    show_routing(&envoy).await?;
    print_examples(&envoy);

    println!("\nUp until Ctrl-C.");
    tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
    println!("\nstopping Envoy and the engines");
    drop(envoy);
    drop(engines);
    Ok(())
}

/// Sends a few prompt families through Envoy and prints where each request landed.
async fn show_routing(envoy: &Envoy) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    println!("Which backend answers (same system prompt -> same engine, so its KV cache stays warm):");
    let families = [
        "You are a pirate.",
        "You are a poet.",
        "You are a lawyer.",
        "You are a historian.",
    ];
    for system in families {
        for question in ["Hello!", "What can you do?"] {
            let body = json!({"model": "local-chat", "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": question}]});
            let line = send(&client, envoy, &body, None).await?;
            println!("  system {system:<28} user {question:<18} -> {line}");
        }
    }
    let body = json!({"model": "local-chat", "messages": [{"role": "user", "content": "Continue our chat."}]});
    for session in ["alice", "bob", "carol"] {
        let line = send(&client, envoy, &body, Some(session)).await?;
        println!(
            "  x-session-id: {session:<22} user {:<18} -> {line}",
            "Continue our chat."
        );
    }
    Ok(())
}

async fn send(client: &reqwest::Client, envoy: &Envoy, body: &Value, session: Option<&str>) -> Result<String, String> {
    let mut req = client
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(s) = session {
        req = req.header("x-session-id", s);
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let h = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    Ok(format!(
        "{} {} ({}, via {})",
        resp.status().as_u16(),
        h("x-emu-backend"),
        h("x-llmroute-affinity-source"),
        h("x-llmroute-upstream")
    ))
}

fn print_examples(envoy: &Envoy) {
    let url = envoy.url("");
    println!(
        r#"
Try it (the x-emu-backend and x-llmroute-upstream response headers name the engine that answered):

  curl -s {url}/v1/models

  curl -si {url}/v1/chat/completions -H 'content-type: application/json' \
    -d '{{"model":"local-chat","messages":[{{"role":"system","content":"You are a pirate."}},{{"role":"user","content":"Hello"}}]}}'

  curl -sN {url}/v1/chat/completions -H 'content-type: application/json' \
    -d '{{"model":"local-chat","stream":true,"messages":[{{"role":"user","content":"Stream to me"}}]}}'

  curl -si {url}/v1/chat/completions -H 'content-type: application/json' -H 'x-session-id: my-agent-42' \
    -d '{{"model":"local-chat","messages":[{{"role":"user","content":"Hi"}}]}}'

  curl -si {url}/v1/chat/completions -H 'content-type: application/json' -d '{{"model":"nope","messages":[]}}'

  curl -s {url}/llmroute/status     # per backend healthy/total and in flight, per alias ready
  curl -si {url}/readyz             # 200 when every alias has a healthy route, else 503

Envoy admin: http://{admin}/stats?filter=llama-a"#,
        admin = envoy.admin
    );
}
