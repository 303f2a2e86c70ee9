//! The `llmroute` command line: validate a config, render Envoy configuration for it (a bootstrap, the pieces for
//! an Envoy you run, or the filter's ECDS resource); and the two long-running helpers of etcd discovery,
//! `discover` (next to Envoy) and `register` (next to an engine).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use llmroute_envoy::discover;
use llmroute_envoy::register::{self, Registration};
use llmroute_envoy::render::{bootstrap_yaml, ecds, target, RenderOptions};

#[derive(Parser)]
#[command(
    name = "llmroute",
    version,
    about = "LLM routing for Envoy: validate llmroute.yaml and render its Envoy bootstrap"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a config file; print a one-line summary, or every error and exit 1.
    Validate {
        /// Path to llmroute.yaml (YAML or JSON).
        config: PathBuf,
    },
    /// Write Envoy configuration for a config file: a complete bootstrap (default), the pieces for an Envoy you
    /// already run, the filter's ECDS resource, or Istio manifests.
    Render {
        /// Path to llmroute.yaml (YAML or JSON).
        config: PathBuf,
        /// Path of llmroute_filter.wasm as Envoy will see it (inside the proxy's container for istio). Required,
        /// except with --target istio and --wasm-url.
        #[arg(long)]
        wasm: Option<String>,
        /// What to write.
        #[arg(long, value_enum, default_value_t = Target::Envoy)]
        target: Target,
        /// With --target envoy or filter: deliver the filter's config through ECDS from this watched file (write
        /// it with --target ecds) instead of inline.
        #[arg(long, value_name = "PATH")]
        ecds_path: Option<String>,
        /// Output file (a directory for `--target istio`); standard output when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        istio: Box<IstioArgs>,
    },
    /// Run next to Envoy: watch each `discovery.etcd` backend's prefix and keep its EDS file (`eds_path`) equal
    /// to the instances registered there. Runs until stopped.
    Discover {
        /// Path to llmroute.yaml (YAML or JSON).
        config: PathBuf,
        /// Also write counters (hosts, writes, etcd errors, reconnects, rejected keys, refused addresses, capped
        /// weights) as JSON to this file.
        #[arg(long, value_name = "PATH")]
        stats: Option<PathBuf>,
    },
    /// Run next to an engine: keep `<prefix>/<addr>` registered in etcd under a lease while the engine's health
    /// URL answers 2xx; revoke it when the check fails. Runs until stopped.
    Register {
        /// etcd client URL (http://HOST:PORT, or https://HOST:PORT with --ca-file); repeat or separate with commas
        /// for several.
        #[arg(long, required = true, value_delimiter = ',')]
        etcd: Vec<String>,
        /// TLS to etcd: the PEM bundle of CAs that etcd's certificates must chain to (as `tls.ca_file`).
        #[arg(long, value_name = "PATH")]
        ca_file: Option<String>,
        /// TLS to etcd: the name every member's certificate must carry, sent as SNI (as `tls.sni`). Default: each
        /// member's own host.
        #[arg(long, value_name = "NAME")]
        sni: Option<String>,
        /// TLS to etcd: a PEM client certificate to present, for etcd's --client-cert-auth (as `tls.cert_file`).
        #[arg(long, value_name = "PATH")]
        cert_file: Option<String>,
        /// TLS to etcd: the client certificate's PEM private key (as `tls.key_file`).
        #[arg(long, value_name = "PATH")]
        key_file: Option<String>,
        /// etcd's user authentication: the user (as `auth.user`). Needs --password-env.
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// etcd's user authentication: the environment variable holding the user's password (as
        /// `auth.password_env`).
        #[arg(long, value_name = "VAR")]
        password_env: Option<String>,
        /// The backend's `discovery.etcd.prefix`.
        #[arg(long)]
        prefix: String,
        /// The engine's IP:PORT, as Envoy reaches it.
        #[arg(long)]
        addr: String,
        /// The engine's health URL, such as http://10.0.0.5:8080/health.
        #[arg(long)]
        health: String,
        /// Lease TTL in seconds: how long the host stays registered after its last proof of life.
        #[arg(long, default_value_t = 10)]
        ttl: u64,
        /// How often the health URL is checked and the lease refreshed, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// The key's value: a JSON object with optional `slots`, `weight`, `model`, `zone`.
        #[arg(long, default_value = "")]
        metadata: String,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    /// A complete Envoy bootstrap.
    Envoy,
    /// One YAML document: `http_filters`, `route` and `clusters` (plus `failover_route` and `secrets` when the
    /// config needs them) to paste into an Envoy you run.
    Filter,
    /// The `DiscoveryResponse` holding the filter's extension config, for a watched ECDS file.
    Ecds,
    /// Istio manifests (EnvoyFilter patches, DestinationRules, a VirtualService) into the -o directory.
    Istio,
}

/// Options of `--target istio` (see docs/deploy-istio.md).
#[derive(clap::Args)]
struct IstioArgs {
    /// istio: fetch the module from this `https://` or `oci://` URL instead of --wasm (needs --sha256).
    #[arg(long)]
    wasm_url: Option<String>,
    /// istio: sha256 of the module fetched from --wasm-url (64 lowercase hex digits).
    #[arg(long)]
    sha256: Option<String>,
    /// istio: namespace of the manifests.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// istio: run in an ingress gateway behind this Istio Gateway (`NAMESPACE/NAME`) instead of the sidecars.
    #[arg(long)]
    gateway: Option<String>,
    /// istio: with --gateway, the host clients call.
    #[arg(long, default_value = "*")]
    gateway_host: String,
    /// istio: with --gateway, the value of the gateway pods' `istio` label.
    #[arg(long, default_value = "ingressgateway")]
    gateway_selector: String,
}

fn render_istio(config: &PathBuf, wasm: Option<String>, a: IstioArgs, out: Option<PathBuf>) -> Result<(), String> {
    use llmroute_envoy::render::istio::{manifests, Deployment, IstioOptions, WasmSource};
    let out = out.ok_or("--target istio needs -o DIR")?;
    let (cfg, text) = load(config)?;
    let mut opts = IstioOptions::sidecar(WasmSource::from_args(wasm, a.wasm_url, a.sha256)?, a.namespace);
    if let Some(gateway) = a.gateway {
        opts.deployment = Deployment::Gateway {
            gateway,
            host: a.gateway_host,
            selector: a.gateway_selector,
        };
    }
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for (name, yaml) in manifests(&cfg, &text, &opts)? {
        let path = out.join(name);
        std::fs::write(&path, yaml).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Validate { config } => {
            let (cfg, _) = load(&config)?;
            let endpoints: usize = cfg.backends.iter().map(|b| b.endpoints.len()).sum();
            println!(
                "{}: ok: {} backend(s), {} endpoint(s), {} model alias(es); listen {}, admin {}",
                config.display(),
                cfg.backends.len(),
                endpoints,
                cfg.models.len(),
                cfg.listen,
                cfg.admin
            );
            Ok(())
        }
        Command::Render {
            config,
            wasm,
            target,
            ecds_path,
            output,
            istio,
        } => {
            let wasm = match (target, wasm) {
                (Target::Istio, wasm) => return render_istio(&config, wasm, *istio, output),
                (_, Some(wasm)) => wasm,
                (_, None) => {
                    use clap::CommandFactory;
                    Cli::command()
                        .error(
                            clap::error::ErrorKind::MissingRequiredArgument,
                            "--wasm PATH is required",
                        )
                        .exit()
                }
            };
            let (cfg, text) = load(&config)?;
            let mut opts = RenderOptions::new(wasm);
            opts.ecds_path = ecds_path;
            let yaml = match target {
                Target::Envoy => bootstrap_yaml(&cfg, &text, &opts)?,
                Target::Filter => {
                    for l in target::limitations(&cfg) {
                        eprintln!("{}: note: {l}", config.display());
                    }
                    target::filter_yaml(&cfg, &text, &opts)?
                }
                Target::Ecds if opts.ecds_path.is_some() => {
                    return Err("--ecds-path goes with --target envoy or filter, not ecds".into());
                }
                Target::Ecds => ecds::ecds_yaml(&cfg, &text, &opts)?,
                // Written as a directory of manifests by `render_istio`, above.
                Target::Istio => return Err("--target istio writes a directory: give -o DIR".into()),
            };
            match output {
                Some(path) => std::fs::write(&path, yaml).map_err(|e| format!("{}: {e}", path.display())),
                None => {
                    print!("{yaml}");
                    Ok(())
                }
            }
        }
        Command::Discover { config, stats } => {
            let (cfg, _) = load(&config)?;
            discover::run(&cfg, stats)
        }
        Command::Register {
            etcd,
            ca_file,
            sni,
            cert_file,
            key_file,
            user,
            password_env,
            prefix,
            addr,
            health,
            ttl,
            interval_ms,
            metadata,
        } => register(Registration {
            etcd,
            tls: register::tls_flags(ca_file, sni, cert_file, key_file)?,
            auth: register::auth_flags(user, password_env)?,
            prefix,
            addr,
            health,
            ttl_s: ttl,
            metadata,
            interval: std::time::Duration::from_millis(interval_ms),
        }),
    }
}

fn register(reg: Registration) -> Result<(), String> {
    register::check(&reg)?;
    register::Registrar::new(reg)?.run()
}

fn load(path: &PathBuf) -> Result<(llmroute_core::Config, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match llmroute_core::load_config(&text) {
        Ok(cfg) => {
            for w in &cfg.warnings {
                eprintln!("{}: warning: {w}", path.display());
            }
            Ok((cfg, text))
        }
        Err(errs) => {
            let n = errs.0.len();
            let lines: Vec<String> = errs.0.iter().map(|e| format!("  {e}")).collect();
            Err(format!("{}: {n} error(s):\n{}", path.display(), lines.join("\n")))
        }
    }
}
