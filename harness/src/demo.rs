//! `make demo`: three engines behind a real Envoy running the llmroute filter, on the fixed addresses of
//! `envoy/llmroute.yaml` (engines on 127.0.0.1:8081-8083, Envoy on 127.0.0.1:10000, admin on 127.0.0.1:9901).
//!
//! The engines are real llama.cpp `llama-server`s on the tiny model (`make engines`), each with `--alias
//! llama-a-N`, so the answer's `model` names the server that answered; or, with `DEMO_ENGINE=emulator`, the
//! instant emulators, which name themselves in the `x-emu-backend` header. [`run`] starts everything, shows
//! which engine answers which prompt family, prints curl, openai-SDK and anthropic-SDK commands that work as
//! printed, and stops everything on Ctrl-C.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::emulator::{Emulator, EmulatorOptions};
use crate::envoy::{Envoy, EnvoyOptions};
use crate::llama::LlamaFleet;

/// The demo's config (also shipped as `envoy/llmroute.yaml`).
pub const CONFIG: &str = include_str!("../../envoy/llmroute.yaml");

/// The engines of the demo. Dropping them stops them.
pub enum Engines {
    /// Real `llama-server`s.
    Llama(LlamaFleet),
    /// Emulated llama.cpp engines (`DEMO_ENGINE=emulator`).
    Emulated(Vec<Emulator>),
}

impl Engines {
    /// Starts the engines `DEMO_ENGINE` names (`llama-server`, the default, or `emulator`) on the endpoints of
    /// the config's first backend, named `<backend>-0`, `<backend>-1`, ...
    pub async fn start(engine: &str, cfg: &llmroute_core::Config) -> Result<Engines, String> {
        let backend = cfg.backends.first().ok_or("the demo config has no backend")?;
        let ports: Vec<u16> = backend.endpoints.iter().map(|e| e.port).collect();
        match engine {
            "" | "llama-server" | "llama" => {
                let fleet = LlamaFleet::start(&backend.name, ports.len(), |i, o| o.port = ports.get(i).copied())
                    .await
                    .map_err(|e| {
                        format!("{e}\n(ports {ports:?} must be free; DEMO_ENGINE=emulator needs no engine)")
                    })?;
                for s in &fleet.servers {
                    let o = s.options();
                    println!(
                        "engine  {} on {}: llama-server, {} (-c {} -np {} -t {})",
                        s.alias(),
                        s.endpoint(),
                        o.model.file_name().and_then(|f| f.to_str()).unwrap_or("?"),
                        o.ctx,
                        o.parallel,
                        o.threads
                    );
                }
                Ok(Engines::Llama(fleet))
            }
            "emulator" => {
                let mut engines = Vec::new();
                for (i, port) in ports.iter().enumerate() {
                    let mut opts = EmulatorOptions::new(&format!("{}-{i}", backend.name));
                    opts.model = "qwen3-0.6b".into();
                    opts.chunk_delay_ms = 150;
                    opts.port = *port;
                    let engine = Emulator::spawn_with(opts)
                        .await
                        .map_err(|e| format!("cannot start the emulated engine on port {port}: {e}"))?;
                    println!("engine  {} on {} (emulated)", engine.name(), engine.addr());
                    engines.push(engine);
                }
                Ok(Engines::Emulated(engines))
            }
            other => Err(format!(
                "DEMO_ENGINE={other}: expected llama-server (the default) or emulator"
            )),
        }
    }

    fn is_real(&self) -> bool {
        matches!(self, Engines::Llama(_))
    }
}

/// The whole demo: engines, Envoy, a routing tour, examples, then wait for Ctrl-C (or SIGTERM), and stop them.
/// With `discovery` = `etcd`, the engines are found through a local etcd instead of the config's list.
pub async fn run(engine: &str, discovery: &str) -> Result<(), String> {
    let cfg = llmroute_core::load_document(CONFIG).map_err(|e| e.to_string())?;
    let engines = Engines::start(engine, &cfg).await?;
    let mut doc: Value = serde_json::from_str(&crate::render::config_json(CONFIG)?).map_err(|e| e.to_string())?;
    let _etcd = match discovery {
        "" | "static" => None,
        "etcd" => Some(EtcdDemo::start(&cfg, &mut doc).await?),
        other => {
            return Err(format!(
                "DEMO_DISCOVERY={other}: expected etcd, or nothing for the listed endpoints"
            ))
        }
    };
    let opts = EnvoyOptions {
        fixed_ports: true,
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(doc, opts).await?;
    println!(
        "envoy   listening on {} (admin {}), filter loaded\n",
        envoy.listen, envoy.admin
    );
    wait_ready(&envoy).await?;
    show_routing(&envoy, engines.is_real()).await?;
    print_examples(&envoy, engines.is_real());
    println!("\nUp until Ctrl-C.");
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.map_err(|e| e.to_string())?,
        _ = term.recv() => {}
    }
    println!("\nstopping Envoy and the engines");
    drop(envoy);
    drop(engines);
    Ok(())
}

/// Etcd discovery for the demo: a local etcd, one `llmroute register` per engine, and `llmroute discover`
/// writing the EDS file the rendered cluster reads. Dropping it stops them all.
struct EtcdDemo {
    _discover: crate::etcd::CliProcess,
    _registers: Vec<crate::etcd::CliProcess>,
    _etcd: crate::etcd::Etcd,
    _dir: tempfile::TempDir,
}

impl EtcdDemo {
    /// Starts etcd, registers the first backend's engines, runs `discover`, and turns `doc`'s first backend
    /// into an etcd-discovered one.
    async fn start(cfg: &llmroute_core::Config, doc: &mut Value) -> Result<EtcdDemo, String> {
        use crate::etcd::{CliProcess, Etcd};
        let backend = cfg.backends.first().ok_or("the demo config has no backend")?;
        let prefix = format!("/llmroute/backends/{}", backend.name);
        let etcd = Etcd::start().await?;
        println!("etcd    on {} (data in a temporary directory)", etcd.url());
        let mut registers = Vec::new();
        for e in &backend.endpoints {
            let addr = e.to_string();
            let health = format!("http://{addr}/health");
            let args = [
                "register",
                "--etcd",
                &etcd.url(),
                "--prefix",
                &prefix,
                "--addr",
                &addr,
                "--health",
                &health,
            ];
            registers.push(CliProcess::start(&args)?);
            println!("register {addr} under {prefix}/ while {health} answers");
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let eds = dir.path().join(format!("{}.eds.json", backend.name));
        let b = &mut doc["backends"][0];
        if let Some(map) = b.as_object_mut() {
            map.remove("endpoints");
        }
        b["discovery"] = json!({
            "eds_path": eds.display().to_string(),
            // The demo's engines run on this host, on loopback: allow it (discover refuses loopback by default).
            "etcd": { "endpoints": [etcd.url()], "prefix": prefix, "allow_loopback": true },
        });
        let config = dir.path().join("llmroute.json");
        std::fs::write(&config, doc.to_string()).map_err(|e| e.to_string())?;
        let config_arg = config.display().to_string();
        let discover = CliProcess::start(&["discover", &config_arg])?;
        println!(
            "discover writes {} (log {})",
            eds.display(),
            discover.log_path().display()
        );
        let want = backend.endpoints.len();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&eds).unwrap_or_default();
            let v: Value = serde_json::from_str(&text).unwrap_or_default();
            let n = v["resources"][0]["endpoints"][0]["lb_endpoints"]
                .as_array()
                .map_or(0, Vec::len);
            if n == want {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "discover found {n} of {want} engines in etcd within 20 s:\n{}",
                    discover.log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("discover found the {want} engines in etcd");
        Ok(EtcdDemo {
            _discover: discover,
            _registers: registers,
            _etcd: etcd,
            _dir: dir,
        })
    }
}

/// Waits until `/readyz` says every alias has a healthy engine (Envoy's first health checks have passed).
async fn wait_ready(envoy: &Envoy) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = reqwest::get(envoy.url("/readyz")).await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err("Envoy's health checks did not pass within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends a few prompt families through Envoy and prints where each request landed.
async fn show_routing(envoy: &Envoy, real: bool) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    println!("Which engine answers (same system prompt -> same engine, so its KV cache stays warm):");
    let families = [
        "You are a pirate. Answer every question in the voice of an old sea captain, with nautical words.",
        "You are a poet. Answer every question with a short rhyming verse of four lines.",
        "You are a lawyer. Answer every question with careful caveats and precise definitions.",
        "You are a historian. Answer every question with a date and a short account of what happened.",
    ];
    for system in families {
        for question in ["Hello!", "What can you do?"] {
            let body = json!({"model": "local-chat", "max_tokens": 8, "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": question}]});
            let line = send(&client, envoy, &body, None, real).await?;
            let short: String = system.chars().take(18).collect();
            println!("  system {short:<21} user {question:<18} -> {line}");
        }
    }
    let body = json!({"model": "local-chat", "max_tokens": 8, "messages": [{"role": "user", "content": "Continue our chat."}]});
    for session in ["alice", "bob", "carol"] {
        let line = send(&client, envoy, &body, Some(session), real).await?;
        println!(
            "  x-session-id: {session:<15} user {:<18} -> {line}",
            "Continue our chat."
        );
    }
    Ok(())
}

async fn send(
    client: &reqwest::Client,
    envoy: &Envoy,
    body: &Value,
    session: Option<&str>,
    real: bool,
) -> Result<String, String> {
    let mut req = client
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(s) = session {
        req = req.header("x-session-id", s);
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let h = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    let (source, placement, upstream, emu) = (
        h("x-llmroute-affinity-source"),
        h("x-llmroute-placement"),
        h("x-llmroute-upstream"),
        h("x-emu-backend"),
    );
    let answer: Value = resp.json().await.unwrap_or(Value::Null);
    Ok(if real {
        let usage = &answer["usage"];
        format!(
            "{status} {} ({source}, {placement}, via {upstream}, {}/{} prompt tokens cached)",
            answer["model"].as_str().unwrap_or("-"),
            usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
            usage["prompt_tokens"].as_u64().unwrap_or(0),
        )
    } else {
        format!("{status} {emu} ({source}, {placement}, via {upstream})")
    })
}

/// The commands to try by hand. Run from the repository root, they work as printed.
pub fn examples(base: &str, real: bool) -> String {
    let who = if real {
        "the answer's \"model\" is the --alias of the llama-server that answered, and the x-llmroute-upstream \
         response header its address"
    } else {
        "the x-emu-backend and x-llmroute-upstream response headers name the engine that answered"
    };
    let py = ".tools/venv/bin/python";
    format!(
        r#"Try it from the repository root ({who}):

  curl -s {base}/v1/models

  curl -si {base}/v1/chat/completions -H 'content-type: application/json' \
    -d '{{"model":"local-chat","max_tokens":16,"messages":[{{"role":"system","content":"You are a pirate."}},{{"role":"user","content":"Hello"}}]}}'

  curl -sN {base}/v1/chat/completions -H 'content-type: application/json' \
    -d '{{"model":"local-chat","max_tokens":16,"stream":true,"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"Stream to me"}}]}}'

  curl -si {base}/v1/chat/completions -H 'content-type: application/json' -H 'x-session-id: my-agent-42' \
    -d '{{"model":"local-chat","max_tokens":16,"messages":[{{"role":"user","content":"Hi"}}]}}'

  curl -si {base}/v1/chat/completions -H 'content-type: application/json' -d '{{"model":"nope","messages":[]}}'

  # the openai SDK, streamed: each chunk's model names the engine
  {py} -c 'import openai; c = openai.OpenAI(base_url="{base}/v1", api_key="unused"); s = c.chat.completions.create(model="local-chat", max_tokens=16, stream=True, stream_options={{"include_usage": True}}, messages=[{{"role": "system", "content": "You are a pirate."}}, {{"role": "user", "content": "Hello"}}]); [print(k.model, repr(k.choices[0].delta.content) if k.choices else k.usage) for k in s]'

  # the anthropic SDK (Messages API): same system prompt, so the same engine, with its prompt cached
  {py} -c 'import anthropic; c = anthropic.Anthropic(base_url="{base}", api_key="unused"); m = c.messages.create(model="local-chat", max_tokens=16, system="You are a pirate.", messages=[{{"role": "user", "content": "Hello"}}]); print(m.model, m.usage)'

  # the anthropic SDK, streamed
  {py} -c 'import anthropic; c = anthropic.Anthropic(base_url="{base}", api_key="unused"); s = c.messages.create(model="local-chat", max_tokens=16, stream=True, system="You are a poet.", messages=[{{"role": "user", "content": "Hi"}}]); [print(e.message.model if e.type == "message_start" else repr(e.delta.text) if e.type == "content_block_delta" else e.type) for e in s]'

  curl -s {base}/llmroute/status     # per backend healthy/total and in flight, per alias ready
  curl -si {base}/readyz             # 200 when every alias has a healthy route, else 503"#
    )
}

fn print_examples(envoy: &Envoy, real: bool) {
    println!("\n{}\n", examples(&envoy.url(""), real));
    println!(
        "Envoy admin: http://{admin}/stats?filter=llama-a    the /props fleet check: http://{admin}/stats?filter=fleet",
        admin = envoy.admin
    );
}
