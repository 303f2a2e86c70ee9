//! `llmroute render --target istio`: the Kubernetes manifests that run the filter in Istio, on workloads of its
//! own, with the engines reachable through those workloads only.
//!
//! Where the filter runs ([`Deployment`]):
//! - `Proxy` (the default): llmroute's own proxies, an Istio gateway deployment named `llmroute` in the
//!   namespace (pods labelled `istio: llmroute`, service account `llmroute`), which clients call through the
//!   `llmroute` Service. Every HTTP listener of those pods carries the filter ([`patches`]);
//! - `Gateway`: an ingress gateway you run, on the listener of `listen`'s port.
//!
//! Why no other path reaches an engine: one `AuthorizationPolicy` per engine namespace ([`policy`]) denies every
//! request whose mTLS identity is not the filter's workloads' service account, plaintext included. A DENY policy
//! wins over any ALLOW policy, so no other policy reopens the path. The `VirtualService` binds to llmroute's
//! `Gateway` only (never to the mesh's sidecars), and that `Gateway` admits only `VirtualService`s of its own
//! namespace.
//!
//! What the proxies need besides the patches ([`workload`]): the API keys of `auth.keys_env` from a Secret, as an
//! environment variable of the `istio-proxy` container (the filter reads it through `host_env_keys`); the
//! filter's `stats_tags`, which only the bootstrap can carry, through Istio's bootstrap override. Istio's proxy
//! admin is `127.0.0.1:15000`: the embedded config's `admin` is set to it, so the filter names the address it
//! polls.
//!
//! Everything Envoy-side reuses the standalone bootstrap's builders, so both targets route the same way. What
//! cannot work under Istio is refused, every reason at once ([`check`]).

mod patches;
mod policy;
mod traffic;
mod workload;

use std::collections::BTreeSet;

use llmroute_core::config::{Backend, Document, EngineKind};
use llmroute_core::route_choice::has_failover;
use serde_json::{json, Value};

use super::json::config_json;

/// The `VirtualService` route the `HTTP_ROUTE` patch finds by name.
pub const ROUTE_NAME: &str = "llmroute";
/// The name of llmroute's own proxies: Deployment, ServiceAccount, Service, Gateway, and the `istio` label.
pub const PROXY_NAME: &str = "llmroute";
/// Istio's proxy admin port.
pub const ISTIO_ADMIN_PORT: u16 = 15000;
/// Ports an Istio proxy keeps for itself (admin, traffic capture, status, metrics).
const ISTIO_PORTS: std::ops::RangeInclusive<u16> = 15000..=15090;

/// Where the proxy finds `llmroute_filter.wasm`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WasmSource {
    /// An absolute path inside the proxy's container (mounted from a volume).
    Local(String),
    /// `https://` or `oci://`, verified against `sha256` (64 lowercase hex digits).
    Remote { url: String, sha256: String },
}

impl WasmSource {
    /// The CLI's `--wasm PATH` or `--wasm-url URL --sha256 HEX`, checked.
    pub fn from_args(path: Option<String>, url: Option<String>, sha256: Option<String>) -> Result<Self, String> {
        match (path, url, sha256) {
            (Some(p), None, None) if p.starts_with('/') => Ok(WasmSource::Local(p)),
            (Some(p), None, None) => Err(format!(
                "--wasm: {p:?} is not an absolute path; give the module's path inside the proxy's container, e.g. /var/local/wasm/llmroute_filter.wasm"
            )),
            (None, Some(url), Some(sha)) => {
                if !(url.starts_with("https://") || url.starts_with("oci://")) {
                    return Err(format!(
                        "--wasm-url: {url:?} must start with https:// or oci://; for a file in the container use --wasm PATH"
                    ));
                }
                if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                    return Err(format!(
                        "--sha256: {sha:?} is not 64 lowercase hex digits; use the output of `sha256sum llmroute_filter.wasm`"
                    ));
                }
                Ok(WasmSource::Remote { url, sha256: sha })
            }
            (None, Some(_), None) => Err("--wasm-url needs --sha256 HEX (the module's sha256)".into()),
            (None, None, Some(_)) => Err("--sha256 goes with --wasm-url URL".into()),
            (None, None, None) => Err("--target istio needs --wasm PATH or --wasm-url URL --sha256 HEX".into()),
            _ => Err("give either --wasm PATH or --wasm-url URL --sha256 HEX, not both".into()),
        }
    }
}

/// Where the filter runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deployment {
    /// llmroute's own proxies ([`PROXY_NAME`]), rendered here: an Istio gateway deployment clients reach
    /// through the `llmroute` Service.
    Proxy,
    /// An ingress gateway you run, whose pods carry `istio: <selector>` labels and the service account
    /// `service_account`, for requests to `host` through the Istio `Gateway` named `gateway` (`NAMESPACE/NAME`).
    Gateway {
        gateway: String,
        host: String,
        selector: String,
        service_account: Option<String>,
    },
}

/// Options of the Istio target.
#[derive(Debug, Clone)]
pub struct IstioOptions {
    pub wasm: WasmSource,
    /// Namespace of the filter's workloads and their manifests (for a gateway: the gateway's namespace).
    pub namespace: String,
    pub deployment: Deployment,
    /// The proxy's admin port, which `llmroute_admin` points at on loopback. Istio's is [`ISTIO_ADMIN_PORT`].
    pub admin_port: u16,
    /// Labels the engines' pods carry: the AuthorizationPolicy then selects only them in each engine namespace.
    /// Empty: it covers every workload of those namespaces.
    pub engine_selector: Vec<(String, String)>,
    /// The mesh's trust domain, the first part of the proxies' identity. Default `cluster.local`.
    pub trust_domain: String,
    /// The Secret (in `namespace`) holding the API keys under the key named by `auth.keys_env`.
    pub keys_secret: String,
}

impl IstioOptions {
    /// llmroute's own proxies in `namespace`, with Istio's defaults.
    pub fn proxy(wasm: WasmSource, namespace: impl Into<String>) -> Self {
        IstioOptions {
            wasm,
            namespace: namespace.into(),
            deployment: Deployment::Proxy,
            admin_port: ISTIO_ADMIN_PORT,
            engine_selector: Vec::new(),
            trust_domain: "cluster.local".into(),
            keys_secret: "llmroute-keys".into(),
        }
    }

    /// The service account of the workloads that run the filter.
    fn service_account(&self) -> Option<&str> {
        match &self.deployment {
            Deployment::Proxy => Some(PROXY_NAME),
            Deployment::Gateway { service_account, .. } => service_account.as_deref(),
        }
    }

    /// The mTLS identity the engines admit, as an AuthorizationPolicy principal.
    pub fn principal(&self) -> Option<String> {
        self.service_account()
            .map(|sa| format!("{}/ns/{}/sa/{sa}", self.trust_domain, self.namespace))
    }
}

/// An Istio backend cluster name, split: `outbound|PORT||HOST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IstioCluster {
    pub port: u16,
    pub host: String,
}

impl IstioCluster {
    /// The Service's namespace, from `SERVICE.NAMESPACE.svc...`.
    pub fn namespace(&self) -> Option<&str> {
        self.host.split('.').nth(1).filter(|n| !n.is_empty())
    }
}

/// Parses `outbound|PORT||HOST` (no subset).
pub fn parse_cluster(name: &str) -> Option<IstioCluster> {
    let mut parts = name.split('|');
    let (dir, port, subset, host) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if dir != "outbound" || !subset.is_empty() || host.is_empty() || parts.next().is_some() {
        return None;
    }
    Some(IstioCluster {
        port: port.parse().ok().filter(|p| *p > 0)?,
        host: host.to_string(),
    })
}

/// The manifests to apply, as `(file name, YAML)`, and the notes to print: what the operator must do besides.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub files: Vec<(String, String)>,
    pub notes: Vec<String>,
}

/// Every reason `cfg` cannot be rendered for Istio with `opts`, each naming its field and its fix. Empty: it can.
pub fn check(cfg: &Document, opts: &IstioOptions) -> Vec<String> {
    let mut errs = Vec::new();
    if cfg.backends.is_empty() {
        errs.push("backends: at least one backend is needed".into());
    }
    for b in &cfg.backends {
        errs.extend(check_backend(b, opts));
    }
    if cfg.global_limits.is_some() {
        // Refused rather than dropped: without the rate-limit filter the limits would silently not apply.
        errs.push("global_limits: the Istio manifests do not carry Envoy's rate-limit filter yet; render --target envoy or --target filter, or leave global_limits out".into());
    }
    if cfg.render_only.listen_tls.is_some() {
        errs.push("listen_tls: under Istio, TLS toward clients is the Gateway's (a server with `tls.credentialName`); remove listen_tls and set it on the Gateway".into());
    }
    if ISTIO_PORTS.contains(&cfg.render_only.listen.port()) {
        errs.push(format!(
            "listen: port {} is one of the ports an Istio proxy keeps for itself (15000-15090); choose another, e.g. 0.0.0.0:8000",
            cfg.render_only.listen.port()
        ));
    }
    if cfg.models.iter().any(has_failover) && matches!(opts.wasm, WasmSource::Remote { .. }) {
        errs.push("models[].routes: failover across backends runs the module as an upstream filter too, which needs --wasm PATH; --wasm-url is not supported with failover yet".into());
    }
    if let Deployment::Gateway {
        service_account: None, ..
    } = opts.deployment
    {
        errs.push("--gateway needs --gateway-service-account NAME, the service account of the gateway's pods: the engines admit that identity only".into());
    }
    errs
}

fn check_backend(b: &Backend, opts: &IstioOptions) -> Vec<String> {
    let name = &b.name;
    let mut errs = Vec::new();
    match parse_cluster(name) {
        None => errs.push(format!(
            "backends[{name}].name: not an Istio outbound cluster name (no subset); name it as Istio names its cluster, `outbound|PORT||SERVICE.NAMESPACE.svc.cluster.local`, with `discovery: {{}}`"
        )),
        Some(c) => match c.namespace() {
            None => errs.push(format!(
                "backends[{name}].name: the host names no namespace; use SERVICE.NAMESPACE.svc.cluster.local"
            )),
            Some(ns) if ns == opts.namespace && opts.engine_selector.is_empty() => errs.push(format!(
                "backends[{name}]: the engines' namespace `{ns}` is where llmroute's workloads run (--namespace); the policy that admits only llmroute's workloads would shut clients out of llmroute too: run llmroute in a namespace of its own (--namespace llmroute), or select the engines' pods with --engine-selector LABEL=VALUE"
            )),
            Some(_) => {}
        },
    }
    if b.discovery.as_ref().is_none_or(|d| d.eds_path.is_some()) {
        errs.push(format!(
            "backends[{name}].discovery: Istio discovers the endpoints, so use `discovery: {{}}` (no endpoints, no eds_path)"
        ));
    }
    if b.tls.is_some() {
        errs.push(format!(
            "backends[{name}].tls: Istio's mTLS secures the hop to the engines; remove tls"
        ));
    }
    if b.credential_env.is_some() {
        errs.push(format!(
            "backends[{name}].credential_env: not rendered for Istio yet; remove it (inject the token another way)"
        ));
    }
    errs
}

/// Every manifest, in the order to apply them, and the notes. `config_text` is the document `cfg` was loaded
/// from. The error lists every reason at once ([`check`]).
pub fn manifests(cfg: &Document, config_text: &str, opts: &IstioOptions) -> Result<Rendered, Vec<String>> {
    let errs = check(cfg, opts);
    if !errs.is_empty() {
        return Err(errs);
    }
    let backends: Vec<(&Backend, IstioCluster)> = cfg
        .backends
        .iter()
        .filter_map(|b| parse_cluster(&b.name).map(|c| (b, c)))
        .collect();
    let plugin_config = plugin_config(config_text, opts).map_err(|e| vec![e])?;
    let mut docs = Vec::new();
    for (ns, v) in policy::authorization_policies(&backends, opts) {
        docs.push((format!("authorizationpolicy-{ns}.yaml"), v));
    }
    let proxy = opts.deployment == Deployment::Proxy;
    if proxy {
        docs.push(("serviceaccount.yaml".into(), workload::service_account(opts)));
    }
    docs.push(("configmap-bootstrap.yaml".into(), workload::bootstrap_config_map(opts)));
    docs.push((
        "envoyfilter.yaml".into(),
        patches::envoy_filter(cfg, &plugin_config, opts, &backends),
    ));
    for (b, c) in &backends {
        docs.push((
            format!("destinationrule-{}.yaml", traffic::short_name(c)),
            traffic::destination_rule(b, c, opts, cfg.fairness.is_some()),
        ));
    }
    if proxy {
        docs.push(("deployment.yaml".into(), workload::deployment(cfg, opts)));
        docs.push(("service.yaml".into(), workload::service(cfg, opts)));
        docs.push(("gateway.yaml".into(), workload::gateway(cfg, opts)));
    }
    if let Some((_, first)) = backends.first() {
        docs.push(("virtualservice.yaml".into(), traffic::virtual_service(cfg, opts, first)));
    }
    let files = docs
        .into_iter()
        .map(|(name, v)| {
            let body = serde_yaml_ng::to_string(&v).map_err(|e| vec![e.to_string()])?;
            Ok((
                name,
                format!(
                    "# Rendered by `llmroute render --target istio` {}.\n{body}",
                    llmroute_core::VERSION
                ),
            ))
        })
        .collect::<Result<_, Vec<String>>>()?;
    Ok(Rendered {
        files,
        notes: notes(cfg, config_text, opts),
    })
}

/// The plugin configuration: the document as JSON, with `admin` set to the proxy's admin address, which is where
/// `llmroute_admin` points and what the filter names when its polls fail.
fn plugin_config(config_text: &str, opts: &IstioOptions) -> Result<String, String> {
    let mut v: Value = serde_json::from_str(&config_json(config_text)?).map_err(|e| e.to_string())?;
    v["admin"] = json!(admin_address(opts));
    Ok(v.to_string())
}

fn admin_address(opts: &IstioOptions) -> String {
    format!("127.0.0.1:{}", opts.admin_port)
}

/// What the operator must know or do besides applying the manifests, one sentence each.
pub fn notes(cfg: &Document, config_text: &str, opts: &IstioOptions) -> Vec<String> {
    let ns = &opts.namespace;
    let mut out = Vec::new();
    let admin = admin_address(opts);
    let written: Option<String> = config_json(config_text)
        .ok()
        .and_then(|j| serde_json::from_str::<Value>(&j).ok())
        .and_then(|v| v.get("admin").and_then(Value::as_str).map(str::to_string));
    let must = format!(
        "it must be the address of the proxy's own admin interface (Istio's default), or /readyz stays 503 and names {admin}"
    );
    match written {
        Some(a) if a != admin => out.push(format!(
            "admin: {a} is replaced by {admin}, the Istio proxy's admin address, which the filter polls for /readyz and /llmroute/status; {must}"
        )),
        _ => out.push(format!(
            "admin: the filter polls the Istio proxy's admin at {admin} for /readyz and /llmroute/status; {must}"
        )),
    }
    let gateway = match &opts.deployment {
        Deployment::Proxy => None,
        Deployment::Gateway { gateway, .. } => Some(gateway.as_str()),
    };
    if let Some(auth) = &cfg.auth {
        let var = &auth.keys_env;
        let secret = &opts.keys_secret;
        out.push(format!(
            "auth.keys_env: create the Secret first, in namespace {ns}: kubectl -n {ns} create secret generic {secret} --from-literal={var}='NAME:TOKEN,...'"
        ));
        out.push(match gateway {
            None => format!(
                "auth.keys_env: deployment.yaml gives the proxies' istio-proxy container {var} from the Secret {secret}; pods started before the Secret existed do not start until it does"
            ),
            Some(_) => format!(
                "auth.keys_env: your gateway pods' istio-proxy container needs {var}: kubectl -n {ns} set env deployment/<your gateway> -c istio-proxy --from=secret/{secret}"
            ),
        });
    }
    match gateway {
        None => out.push(format!(
            "metrics: deployment.yaml mounts the ConfigMap {} into istio-proxy as its bootstrap override, which adds the filter's stats_tags",
            workload::BOOTSTRAP_CONFIG_MAP
        )),
        Some(_) => out.push(format!(
            "metrics: for the filter's labels, your gateway's istio-proxy container needs the ConfigMap {} as its bootstrap override: {}",
            workload::BOOTSTRAP_CONFIG_MAP,
            workload::bootstrap_patch_hint(ns)
        )),
    }
    if let WasmSource::Local(path) = &opts.wasm {
        out.push(format!(
            "--wasm {path}: the module must be readable at that path inside the istio-proxy container; mount a volume there, or use --wasm-url"
        ));
    }
    let namespaces: BTreeSet<String> = cfg
        .backends
        .iter()
        .filter_map(|b| parse_cluster(&b.name))
        .filter_map(|c| c.namespace().map(str::to_string))
        .collect();
    let principal = opts.principal().unwrap_or_default();
    out.push(format!(
        "engines: the AuthorizationPolicy in {} denies every request not made as {principal} (plaintext included){}",
        namespaces.into_iter().collect::<Vec<_>>().join(", "),
        if opts.engine_selector.is_empty() {
            "; it covers every workload of those namespaces, so keep other services out of them or give --engine-selector"
        } else {
            ""
        }
    ));
    if cfg.backends.iter().any(|b| b.kind == EngineKind::LlamaCpp) {
        out.push("the /props fleet check calls each llama.cpp pod in plain HTTP, which that policy refuses: under Istio it finds nothing to compare".into());
    }
    out
}

#[cfg(test)]
mod tests;
