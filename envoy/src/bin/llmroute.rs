//! The `llmroute` command line: validate a config, render Envoy configuration for it (a bootstrap, the pieces for
//! an Envoy you run, or the filter's ECDS resource); and the two long-running helpers of etcd discovery,
//! `discover` (next to Envoy) and `register` (next to an engine).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use llmroute_envoy::discover;
use llmroute_envoy::register::{self, Registration};
use llmroute_envoy::render::{bootstrap_yaml, ecds, paste, target, RenderOptions};

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
        /// Exit 1 when a variable the config names (`auth.keys_env`, `backends[].credential_env`) is not set in
        /// this environment, or holds keys the filter would refuse; without it these are warnings. Envoy does not
        /// start without them: use it where this command runs with Envoy's environment.
        #[arg(long)]
        require_env: bool,
    },
    /// Write Envoy configuration for a config file: a complete bootstrap (default), the pieces for an Envoy you
    /// already run, the filter's ECDS resource, or Istio manifests.
    Render {
        /// Path to llmroute.yaml (YAML or JSON).
        config: PathBuf,
        /// Absolute path of llmroute_filter.wasm as Envoy will see it (inside the proxy's container for istio).
        /// Required, except with --target istio and --wasm-url.
        #[arg(long, value_parser = absolute_wasm_path)]
        wasm: Option<String>,
        /// Render the native build instead: Envoy's dynamic-module filter loading libllmroute_native.so from this
        /// absolute path (`make native`), in place of --wasm. With --target envoy, filter or ecds.
        #[arg(long, value_parser = absolute_wasm_path, conflicts_with = "wasm")]
        module: Option<String>,
        /// What to write.
        #[arg(long, value_enum, default_value_t = Target::Envoy)]
        target: Target,
        /// With --target envoy or filter: deliver the filter's config through ECDS from this watched file (write
        /// it with --target ecds) instead of inline.
        #[arg(long, value_name = "PATH")]
        ecds_path: Option<String>,
        /// With --target filter: write this Envoy config of yours (YAML) with its `"@llmroute SECTION"` markers
        /// replaced by the sections, instead of the sections alone.
        #[arg(long, value_name = "TEMPLATE")]
        paste_into: Option<PathBuf>,
        /// Output file (a directory for `--target istio`); standard output when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Exit 1 when a variable the config names (`auth.keys_env`, `backends[].credential_env`) is not set in
        /// this environment, or holds keys the filter would refuse; without it these are warnings. Envoy does not
        /// start without them: use it where this command runs with Envoy's environment.
        #[arg(long)]
        require_env: bool,
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
        /// The engine's IP:PORT, as Envoy reaches it; or HOST:PORT, whose name is resolved at each registration and
        /// must resolve to that one IP.
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
    /// One YAML document of labelled sections (bootstrap, listener, connection manager, filters, routes,
    /// clusters) to paste into an Envoy you run; with --paste-into, your config with them pasted in.
    Filter,
    /// The `DiscoveryResponse` holding the filter's extension config, for a watched ECDS file.
    Ecds,
    /// Istio manifests (llmroute's proxies, the EnvoyFilter, traffic rules, the engines' AuthorizationPolicy)
    /// into the -o directory.
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
    /// istio: namespace of llmroute's workloads and manifests; not an engine namespace (see --engine-selector).
    #[arg(long, default_value = "llmroute")]
    namespace: String,
    /// istio: run in an ingress gateway behind this Istio Gateway (`NAMESPACE/NAME`) instead of llmroute's own
    /// proxies.
    #[arg(long)]
    gateway: Option<String>,
    /// istio: with --gateway, the host clients call.
    #[arg(long, default_value = "*")]
    gateway_host: String,
    /// istio: with --gateway, the value of the gateway pods' `istio` label.
    #[arg(long, default_value = "ingressgateway")]
    gateway_selector: String,
    /// istio: with --gateway, the service account of the gateway's pods: the only identity the engines admit.
    #[arg(long, value_name = "NAME")]
    gateway_service_account: Option<String>,
    /// istio: a label the engines' pods carry (repeatable): the engines' AuthorizationPolicy covers only those
    /// pods instead of their whole namespace.
    #[arg(long, value_name = "LABEL=VALUE")]
    engine_selector: Vec<String>,
    /// istio: the mesh's trust domain, in the identity the engines admit.
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// istio: the Secret holding the API keys of `auth.keys_env`, under a key of the variable's name.
    #[arg(long, default_value = "llmroute-keys", value_name = "NAME")]
    keys_secret: String,
}

/// `--wasm`: Envoy resolves a relative `filename` from its own working directory, which is seldom this one.
fn absolute_wasm_path(path: &str) -> Result<String, String> {
    if path.starts_with('/') {
        return Ok(path.to_string());
    }
    let cwd = std::env::current_dir().map(|d| d.join(path).display().to_string());
    let here = cwd.map(|p| format!(" (from here: {p})")).unwrap_or_default();
    Err(format!(
        "a relative path, which Envoy would look up from its own working directory, not this one; give the module's \
         absolute path as Envoy sees it, such as /etc/envoy/llmroute_filter.wasm{here}"
    ))
}

fn render_istio(
    config: &PathBuf,
    env: EnvCheck,
    wasm: Option<String>,
    a: IstioArgs,
    out: Option<PathBuf>,
) -> Result<(), String> {
    use llmroute_envoy::render::istio::{manifests, Deployment, IstioOptions, WasmSource};
    let out = out.ok_or("--target istio needs -o DIR")?;
    let (cfg, text) = load(config, env)?;
    // Every problem at once, the flags' and the config's, as `validate` reports a config's.
    let mut errs = Vec::new();
    let wasm = WasmSource::from_args(wasm, a.wasm_url, a.sha256).unwrap_or_else(|e| {
        errs.push(e);
        WasmSource::Local("/".into())
    });
    let mut opts = IstioOptions::proxy(wasm, a.namespace);
    opts.trust_domain = a.trust_domain;
    opts.keys_secret = a.keys_secret;
    for s in a.engine_selector {
        match s.split_once('=') {
            Some((k, v)) if !k.is_empty() => opts.engine_selector.push((k.to_string(), v.to_string())),
            _ => errs.push(format!("--engine-selector: {s:?} is not LABEL=VALUE, e.g. app=vllm")),
        }
    }
    if let Some(gateway) = a.gateway {
        opts.deployment = Deployment::Gateway {
            gateway,
            host: a.gateway_host,
            selector: a.gateway_selector,
            service_account: a.gateway_service_account,
        };
    } else if a.gateway_service_account.is_some() {
        errs.push("--gateway-service-account goes with --gateway".into());
    }
    let rendered = manifests(&cfg, &text, &opts);
    if let Err(e) = &rendered {
        errs.extend(e.iter().cloned());
    }
    let rendered = match rendered {
        Ok(r) if errs.is_empty() => r,
        _ => return Err(report(config, &errs)),
    };
    for n in &rendered.notes {
        eprintln!("{}: note: {n}", config.display());
    }
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for (name, yaml) in rendered.files {
        let path = out.join(name);
        std::fs::write(&path, yaml).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}

/// Every error of a file, one per line, as `validate` prints them.
fn report(path: &std::path::Path, errs: &[String]) -> String {
    let lines: Vec<String> = errs.iter().map(|e| format!("  {e}")).collect();
    format!("{}: {} error(s):\n{}", path.display(), errs.len(), lines.join("\n"))
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
        Command::Validate { config, require_env } => validate(&config, require_env),
        Command::Render {
            config,
            wasm,
            module,
            target,
            ecds_path,
            paste_into,
            output,
            require_env,
            istio,
        } => {
            let env = EnvCheck::from_flag(require_env);
            if paste_into.is_some() && target != Target::Filter {
                return Err("--paste-into goes with --target filter".into());
            }
            let wasm = match (target, wasm, &module) {
                (Target::Istio, _, Some(_)) => {
                    return Err("--module goes with --target envoy, filter or ecds; Istio loads the wasm build".into())
                }
                (Target::Istio, wasm, None) => return render_istio(&config, env, wasm, *istio, output),
                (_, Some(wasm), _) => wasm,
                (_, None, Some(_)) => String::new(),
                (_, None, None) => {
                    use clap::CommandFactory;
                    Cli::command()
                        .error(
                            clap::error::ErrorKind::MissingRequiredArgument,
                            "--wasm PATH (or --module PATH) is required",
                        )
                        .exit()
                }
            };
            let (cfg, text) = load(&config, env)?;
            let mut opts = RenderOptions::new(wasm);
            opts.ecds_path = ecds_path;
            opts.module_path = module;
            let yaml = rendered(&config, target, (&cfg, text.as_str()), &opts, paste_into.as_deref())?;
            match output {
                Some(path) => std::fs::write(&path, yaml).map_err(|e| format!("{}: {e}", path.display())),
                None => {
                    print!("{yaml}");
                    Ok(())
                }
            }
        }
        Command::Discover { config, stats } => {
            let (cfg, _) = load(&config, EnvCheck::Skip)?;
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

/// `llmroute validate`: the one-line summary of a config that loads.
fn validate(config: &PathBuf, require_env: bool) -> Result<(), String> {
    let (cfg, _) = load(config, EnvCheck::from_flag(require_env))?;
    let endpoints: usize = cfg.backends.iter().map(|b| b.endpoints.len()).sum();
    println!(
        "{}: ok: {} backend(s), {} endpoint(s), {} model alias(es); listen {}, admin {}",
        config.display(),
        cfg.backends.len(),
        endpoints,
        cfg.models.len(),
        cfg.render_only.listen,
        cfg.admin
    );
    Ok(())
}

/// The text `llmroute render` writes for `target` (not Istio's, a directory) from the document `cfg` loaded from
/// `text`, the file `config`; `--target filter` also prints its notes on standard error.
fn rendered(
    config: &Path,
    target: Target,
    (cfg, text): (&llmroute_core::Document, &str),
    opts: &RenderOptions,
    paste_into: Option<&Path>,
) -> Result<String, String> {
    match target {
        Target::Envoy => bootstrap_yaml(cfg, text, opts),
        Target::Filter => {
            for l in target::notes(cfg) {
                eprintln!("{}: note: {l}", config.display());
            }
            match paste_into {
                Some(t) => pasted(cfg, text, opts, t),
                None => target::filter_yaml(cfg, text, opts),
            }
        }
        Target::Ecds if opts.ecds_path.is_some() => {
            Err("--ecds-path goes with --target envoy or filter, not ecds".into())
        }
        Target::Ecds => ecds::ecds_yaml(cfg, text, opts),
        // Written as a directory of manifests by `render_istio`.
        Target::Istio => Err("--target istio writes a directory: give -o DIR".into()),
    }
}

/// `--paste-into TEMPLATE`: the template with the sections in place of its markers.
fn pasted(
    cfg: &llmroute_core::Document,
    text: &str,
    opts: &RenderOptions,
    template: &std::path::Path,
) -> Result<String, String> {
    let t = std::fs::read_to_string(template).map_err(|e| format!("{}: {e}", template.display()))?;
    let sections = target::filter_document(&target::pieces(cfg, text, opts)?);
    let v = paste::paste(&t, &sections).map_err(|e| format!("{}: {e}", template.display()))?;
    let body = serde_yaml_ng::to_string(&v).map_err(|e| e.to_string())?;
    Ok(format!(
        "# {} with the sections of `llmroute render --target filter` {} pasted in.\n{body}",
        template.display(),
        llmroute_core::VERSION
    ))
}

fn register(reg: Registration) -> Result<(), String> {
    register::check(&reg)?;
    register::Registrar::new(reg)?.run()
}

/// What [`load`] does about the environment variables a config names (`llmroute_core::config::env_problems`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum EnvCheck {
    /// Not checked: the command does not start Envoy's configuration (`discover`).
    Skip,
    /// Each unset or refused variable is a warning.
    Warn,
    /// Each one is an error (`--require-env`).
    Require,
}

impl EnvCheck {
    fn from_flag(require_env: bool) -> Self {
        if require_env {
            EnvCheck::Require
        } else {
            EnvCheck::Warn
        }
    }
}

fn load(path: &PathBuf, env: EnvCheck) -> Result<(llmroute_core::Document, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cfg = llmroute_core::load_document(&text).map_err(|errs| errors(path, &errs.0))?;
    for w in &cfg.warnings {
        eprintln!("{}: warning: {w}", path.display());
    }
    let missing = match env {
        EnvCheck::Skip => Vec::new(),
        EnvCheck::Warn | EnvCheck::Require => llmroute_core::config::env_problems(&cfg, |name| {
            std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
        }),
    };
    if env == EnvCheck::Require && !missing.is_empty() {
        return Err(errors(path, &missing));
    }
    for w in &missing {
        eprintln!("{}: warning: {w}", path.display());
    }
    Ok((cfg, text))
}

/// `PATH: N error(s):`, then one indented line per error.
fn errors(path: &Path, errs: &[llmroute_core::ConfigError]) -> String {
    report(path, &errs.iter().map(|e| e.to_string()).collect::<Vec<_>>())
}
