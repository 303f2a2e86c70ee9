//! `make demo`: three real llama.cpp `llama-server`s (or, with `DEMO_ENGINE=emulator`, emulated engines) behind
//! a real Envoy running the llmroute filter on 127.0.0.1:10000, until Ctrl-C. `DEMO_DISCOVERY=etcd`: the engines
//! register in a local etcd and `llmroute discover` feeds Envoy. See `llmroute_harness::demo`.

#[tokio::main]
async fn main() {
    let engine = std::env::var("DEMO_ENGINE").unwrap_or_default();
    let discovery = std::env::var("DEMO_DISCOVERY").unwrap_or_default();
    if let Err(e) = llmroute_harness::demo::run(&engine, &discovery).await {
        eprintln!("demo: {e}");
        std::process::exit(1);
    }
}
