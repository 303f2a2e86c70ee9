//! TLS through the real filter in a real Envoy, with certificates the harness generates (`llmroute_harness::certs`):
//! - downstream: `listen_tls` terminates TLS for HTTP/1.1 and HTTP/2, chosen by ALPN, SSE included; a TLS
//!   listener has no plain-HTTP side, and without a certificate the bootstrap has no TLS at all;
//! - upstream: a backend with `tls` is reached through a TLS front (rustls, in this module) that forwards to an
//!   emulator, so the emulator still names the backend and records the request. The front records the SNI it was
//!   sent. A wrong CA, or an SNI the certificate does not name, fails the handshake: 503, and nothing arrives.
//!   A front that requires a client certificate serves the backend whose `tls` gives one (`cert_file`,
//!   `key_file`), and refuses the handshake without one: 503, and nothing arrives.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use llmroute_harness::certs::{PkiFiles, TestPki};
use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::{single_backend_config, Fleet};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::server::{Acceptor, WebPkiClientVerifier};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use crate::support::*;

const H2: &[u8] = b"h2";
const H1: &[u8] = b"http/1.1";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_certs(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.unwrap())
        .collect()
}

/// A fresh CA and server certificate (for localhost, 127.0.0.1 and `names`), written to a temporary directory.
fn pki(names: &[&str]) -> (TestPki, PkiFiles, tempfile::TempDir) {
    let pki = TestPki::generate(names).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files = pki.write(dir.path()).unwrap();
    (pki, files, dir)
}

/// One POST over TLS to `addr`, trusting only `ca_pem`, offering `alpn`. Returns the negotiated ALPN protocol and
/// the response; HTTP/2 when the server chose `h2`, else HTTP/1.1.
async fn tls_post(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
    body: &Value,
    headers: &[(&str, &str)],
) -> (Option<Vec<u8>>, hyper::Response<Incoming>) {
    let mut roots = RootCertStore::empty();
    for cert in pem_certs(ca_pem) {
        roots.add(cert).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
    let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let io = hyper_util::rt::TokioIo::new(tls);
    let h2 = negotiated.as_deref() == Some(H2);
    let uri = if h2 {
        format!("https://localhost:{}/v1/chat/completions", addr.port())
    } else {
        "/v1/chat/completions".to_string()
    };
    let mut req = hyper::Request::post(uri).header("content-type", "application/json");
    if !h2 {
        req = req.header("host", format!("localhost:{}", addr.port()));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    (negotiated, resp)
}

async fn body_json(resp: hyper::Response<Incoming>) -> Value {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

fn header<'r>(resp: &'r hyper::Response<Incoming>, name: &str) -> &'r str {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// One llama.cpp engine behind Envoy, with `listen_tls` from a fresh PKI.
async fn tls_listener() -> (TestPki, tempfile::TempDir, Fleet, Envoy) {
    let (pki, files, dir) = pki(&[]);
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let mut config = single_backend_config(&fleet, ALIAS, UPSTREAM, 150);
    config["listen_tls"] = json!({ "cert_file": files.cert_file, "key_file": files.key_file });
    let envoy = Envoy::start(config).await.unwrap();
    (pki, dir, fleet, envoy)
}

async fn downstream_case(alpn: &[&[u8]], want_alpn: &[u8], want_version: hyper::Version) {
    let (pki, _dir, fleet, envoy) = tls_listener().await;
    let (negotiated, resp) = tls_post(envoy.listen, &pki.ca_pem, alpn, &chat(Some("tls"), "hello"), &[]).await;
    assert_eq!(negotiated.as_deref(), Some(want_alpn));
    assert_eq!(resp.version(), want_version);
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-emu-backend"), "llama-a-0");
    let answer = body_json(resp).await;
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    let got = fleet.engines[0].chat_requests();
    assert_eq!(got.len(), 1);
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(sent["model"], UPSTREAM, "the filter ran on the TLS listener");
    assert_eq!(got[0].header("x-forwarded-proto"), Some("https"));
    let bootstrap = envoy.bootstrap_yaml();
    assert!(bootstrap.contains("DownstreamTlsContext"), "{bootstrap}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downstream_tls_serves_http1_by_alpn() {
    downstream_case(&[H1], H1, hyper::Version::HTTP_11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downstream_tls_serves_http2_by_alpn() {
    downstream_case(&[H2, H1], H2, hyper::Version::HTTP_2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_streams_incrementally_over_tls_on_http1_and_http2() {
    let (pki, _dir, _fleet, envoy) = tls_listener().await;
    for alpn in [&[H1][..], &[H2, H1][..]] {
        let mut body = chat(Some("stream me"), "hi");
        body["stream"] = json!(true);
        let start = Instant::now();
        let headers = [("x-emu-chunk-delay-ms", "300"), ("x-emu-chunks", "3")];
        let (negotiated, resp) = tls_post(envoy.listen, &pki.ca_pem, alpn, &body, &headers).await;
        assert_eq!(negotiated.as_deref(), Some(alpn[0]));
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "content-type"), "text/event-stream");
        let mut stream = resp.into_body();
        let mut all = Vec::new();
        let mut first_event_at = None;
        while let Some(frame) = stream.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                all.extend_from_slice(&data);
            }
            if first_event_at.is_none() && all.windows(2).any(|w| w == b"\n\n") {
                first_event_at = Some(start.elapsed());
            }
        }
        let last_at = start.elapsed();
        let first = first_event_at.unwrap();
        assert!(
            last_at >= first + Duration::from_millis(600),
            "{alpn:?}: the first event ({first:?}) must arrive well before the end ({last_at:?})"
        );
        let text = String::from_utf8(all).unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(
            text.matches("data: ").count(),
            6,
            "role + 3 tokens + final + [DONE]: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_listener_has_no_plain_http_side() {
    let (_pki, _dir, fleet, envoy) = tls_listener().await;
    let plain = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(None, "plain").to_string())
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP must not be served: {plain:?}");
    assert_eq!(fleet.chat_counts(), vec![0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_certificate_the_listener_is_plain_http() {
    let (fleet, envoy) = one_fleet(150).await;
    let bootstrap = envoy.bootstrap_yaml();
    assert!(!bootstrap.contains("transport_socket"), "{bootstrap}");
    assert!(!bootstrap.contains("TlsContext"), "{bootstrap}");
    let (status, backend, _) = post(&client(), &envoy, &chat(None, "plain"), &[]).await;
    assert_eq!((status, backend.starts_with("llama-a-")), (200, true));
    assert_eq!(fleet.chat_counts().iter().sum::<usize>(), 1);
}

/// A TLS server in front of one emulator: terminates TLS with the given certificate and pipes the bytes to the
/// emulator. Records the SNI of each connection's hello, and counts failed handshakes. With `client_auth`, a
/// client must present a certificate signed by `pki`'s CA.
struct TlsFront {
    addr: SocketAddr,
    snis: Arc<Mutex<Vec<Option<String>>>>,
    failed: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TlsFront {
    async fn start(pki: &TestPki, target: SocketAddr, client_auth: bool) -> TlsFront {
        let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes()).unwrap();
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if client_auth {
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(pem_certs(&pki.ca_pem));
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(pem_certs(&pki.cert_pem), key).unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let snis = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(AtomicUsize::new(0));
        let (s, f) = (snis.clone(), failed.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (config, snis, failed) = (config.clone(), s.clone(), f.clone());
                tokio::spawn(async move {
                    let Ok(hello) = LazyConfigAcceptor::new(Acceptor::default(), tcp).await else {
                        failed.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    snis.lock()
                        .unwrap()
                        .push(hello.client_hello().server_name().map(str::to_string));
                    let Ok(mut tls) = hello.into_stream(config).await else {
                        failed.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    if let Ok(mut upstream) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
                    }
                });
            }
        });
        TlsFront {
            addr,
            snis,
            failed,
            task,
        }
    }

    fn snis(&self) -> Vec<Option<String>> {
        self.snis.lock().unwrap().clone()
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One emulated engine behind a TLS front whose certificate names `backend.internal`, and a config whose backend
/// `secure` reaches it with `tls` (`sni`, `ca_file`) and, optionally, a credential.
async fn upstream_case(
    tls: impl FnOnce(&PkiFiles) -> Value,
    credential: Option<(&str, &str)>,
) -> (Fleet, TlsFront, Envoy, tempfile::TempDir) {
    upstream_case_with(
        TestPki::generate(&["backend.internal"]).unwrap(),
        false,
        tls,
        credential,
    )
    .await
}

/// [`upstream_case`] with the front serving `pki`'s certificate, requiring a client certificate with
/// `client_auth`.
async fn upstream_case_with(
    pki: TestPki,
    client_auth: bool,
    tls: impl FnOnce(&PkiFiles) -> Value,
    credential: Option<(&str, &str)>,
) -> (Fleet, TlsFront, Envoy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let files = pki.write(dir.path()).unwrap();
    let fleet = Fleet::start("secure", 1).await.unwrap();
    let front = TlsFront::start(&pki, fleet.engines[0].addr(), client_auth).await;
    let mut backend = json!({ "name": "secure", "kind": "llamacpp", "endpoints": [front.addr.to_string()] });
    backend["tls"] = tls(&files);
    let mut opts = llmroute_harness::envoy::EnvoyOptions::default();
    if let Some((var, token)) = credential {
        backend["credential_env"] = json!(var);
        opts.env.push((var.to_string(), token.to_string()));
    }
    let config = json!({
        "version": 1,
        "backends": [backend],
        "models": [{ "name": ALIAS, "routes": [{ "backend": "secure", "upstream_model": UPSTREAM }] }],
    });
    let envoy = Envoy::start_with(config, opts).await.unwrap();
    (fleet, front, envoy, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tls_verifies_the_ca_file_and_sends_the_sni() {
    let token = "tls-token-7f3a9c";
    let (fleet, front, envoy, _dir) = upstream_case(
        |f| json!({ "sni": "backend.internal", "ca_file": f.ca_file }),
        Some(("LLMROUTE_TEST_TLS_TOKEN", token)),
    )
    .await;
    let (status, backend, body) = post(&client(), &envoy, &chat(None, "over tls"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "secure-0"), "{body}");
    let got = fleet.engines[0].chat_requests();
    assert_eq!(got.len(), 1);
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(sent["model"], UPSTREAM);
    let bearer = format!("Bearer {token}");
    assert_eq!(
        got[0].header("authorization"),
        Some(bearer.as_str()),
        "the token travels inside TLS"
    );
    let snis = front.snis();
    assert!(!snis.is_empty());
    assert!(
        snis.iter().all(|s| s.as_deref() == Some("backend.internal")),
        "{snis:?}"
    );
    assert!(envoy.stat("cluster.secure.ssl.handshake").await.unwrap_or(0) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tls_with_a_wrong_ca_fails_with_503() {
    let other = TestPki::generate(&["backend.internal"]).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other_files = other.write(other_dir.path()).unwrap();
    let (fleet, front, envoy, _dir) = upstream_case(
        |_| json!({ "sni": "backend.internal", "ca_file": other_files.ca_file }),
        None,
    )
    .await;
    let (status, backend, _) = post(&client(), &envoy, &chat(None, "wrong ca"), &[]).await;
    assert_eq!(status, 503);
    assert_eq!(backend, "", "no engine answered");
    assert_eq!(
        fleet.engines[0].chat_requests().len(),
        0,
        "nothing may reach the engine"
    );
    assert!(envoy.stat("cluster.secure.ssl.fail_verify_error").await.unwrap_or(0) >= 1);
    assert!(front.failed.load(Ordering::SeqCst) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tls_refuses_a_certificate_that_does_not_name_the_sni() {
    let (fleet, front, envoy, _dir) =
        upstream_case(|f| json!({ "sni": "other.internal", "ca_file": f.ca_file }), None).await;
    let (status, _, _) = post(&client(), &envoy, &chat(None, "wrong name"), &[]).await;
    assert_eq!(status, 503);
    assert_eq!(fleet.engines[0].chat_requests().len(), 0);
    assert!(envoy.stat("cluster.secure.ssl.fail_verify_san").await.unwrap_or(0) >= 1);
    assert!(front.snis().iter().any(|s| s.as_deref() == Some("other.internal")));
}

/// Without `sni`, the certificate must name the endpoint itself (here its IP, `127.0.0.1`): one from the right CA
/// for another name is refused before any byte of the request, so the token never reaches that server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sni_a_certificate_for_another_name_is_refused_and_gets_no_token() {
    let wrong_name = TestPki::generate_exact(&["backend.internal", "10.9.9.9"]).unwrap();
    let (fleet, front, envoy, _dir) = upstream_case_with(
        wrong_name,
        false,
        |f| json!({ "ca_file": f.ca_file }),
        Some(("LLMROUTE_TEST_TLS_TOKEN", "tls-token-wrong-name")),
    )
    .await;
    let (status, backend, _) = post(&client(), &envoy, &chat(None, "wrong name, right ca"), &[]).await;
    assert_eq!((status, backend.as_str()), (503, ""));
    assert_eq!(
        fleet.engines[0].chat_requests().len(),
        0,
        "no request, and so no token, may reach it"
    );
    assert!(envoy.stat("cluster.secure.ssl.fail_verify_san").await.unwrap_or(0) >= 1);
    assert!(front.failed.load(Ordering::SeqCst) >= 1);
    assert!(
        front.snis().iter().all(Option::is_none),
        "an IP endpoint gets no SNI: {:?}",
        front.snis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sni_a_certificate_that_names_the_endpoint_ip_works() {
    let token = "tls-token-right-name";
    let (fleet, front, envoy, _dir) = upstream_case(
        |f| json!({ "ca_file": f.ca_file }),
        Some(("LLMROUTE_TEST_TLS_TOKEN", token)),
    )
    .await;
    let (status, backend, body) = post(&client(), &envoy, &chat(None, "right name"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "secure-0"), "{body}");
    let got = fleet.engines[0].chat_requests();
    assert_eq!(got.len(), 1);
    let bearer = format!("Bearer {token}");
    assert_eq!(got[0].header("authorization"), Some(bearer.as_str()));
    assert!(front.snis().iter().all(Option::is_none), "{:?}", front.snis());
    let bootstrap = envoy.bootstrap_yaml();
    assert!(bootstrap.contains("IP_ADDRESS"), "{bootstrap}");
}

/// An engine front that requires a client certificate (mTLS): the backend whose `tls` gives one is served; the same
/// backend without one fails the handshake, gets a 503, and nothing reaches the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_requiring_a_client_certificate_serves_the_backend_that_presents_one() {
    let mtls = |f: &PkiFiles| json!({ "sni": "backend.internal", "ca_file": f.ca_file, "cert_file": f.client_cert_file, "key_file": f.client_key_file });
    let pki = || TestPki::generate(&["backend.internal"]).unwrap();
    let (fleet, _front, envoy, _dir) = upstream_case_with(pki(), true, mtls, None).await;
    let (status, backend, body) = post(&client(), &envoy, &chat(None, "mutual tls"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "secure-0"), "{body}");
    assert_eq!(fleet.engines[0].chat_requests().len(), 1);
    assert!(envoy.stat("cluster.secure.ssl.handshake").await.unwrap_or(0) >= 1);

    let plain_tls = |f: &PkiFiles| json!({ "sni": "backend.internal", "ca_file": f.ca_file });
    let (fleet, front, envoy, _dir) = upstream_case_with(pki(), true, plain_tls, None).await;
    let (status, backend, _) = post(&client(), &envoy, &chat(None, "no client certificate"), &[]).await;
    assert_eq!((status, backend.as_str()), (503, ""));
    assert_eq!(
        fleet.engines[0].chat_requests().len(),
        0,
        "nothing may reach the engine"
    );
    assert!(
        front.failed.load(Ordering::SeqCst) >= 1,
        "the front refused the handshake"
    );
}

/// A discovered backend (`discovery: { eds_path }`, two llama.cpp engines, each behind a TLS front) with `tls` and a
/// credential: requests, and the `/props` fleet check's original-destination probe cluster, reach the engines over
/// TLS under the `sni`, and the token travels inside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovered_backend_with_tls_talks_tls_to_its_engines_probes_included() {
    let pki = TestPki::generate(&["backend.internal"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files = pki.write(dir.path()).unwrap();
    let fleet = Fleet::start("secure", 2).await.unwrap();
    let mut fronts = Vec::new();
    for e in &fleet.engines {
        fronts.push(TlsFront::start(&pki, e.addr(), false).await);
    }
    let eds = dir.path().join("eds.json");
    let addrs: Vec<String> = fronts.iter().map(|f| f.addr.to_string()).collect();
    crate::discovery::write_eds(&eds, "secure", 1, &addrs);
    let (var, token) = ("LLMROUTE_TEST_DISCOVERED_TOKEN", "tls-token-discovered");
    let config = json!({
        "version": 1,
        "backends": [{
            "name": "secure",
            "kind": "llamacpp",
            "discovery": { "eds_path": eds.display().to_string() },
            "tls": { "sni": "backend.internal", "ca_file": files.ca_file },
            "credential_env": var,
        }],
        "models": [{ "name": ALIAS, "routes": [{ "backend": "secure", "upstream_model": UPSTREAM }] }],
    });
    let mut opts = llmroute_harness::envoy::EnvoyOptions::default();
    opts.env.push((var.to_string(), token.to_string()));
    let envoy = Envoy::start_with(config, opts).await.unwrap();

    let (status, backend, body) = post(&client(), &envoy, &chat(None, "discovered, over tls"), &[]).await;
    assert_eq!((status, backend.starts_with("secure-")), (200, true), "{body}");
    let got: Vec<_> = fleet.engines.iter().flat_map(|e| e.chat_requests()).collect();
    assert_eq!(got.len(), 1);
    let bearer = format!("Bearer {token}");
    assert_eq!(got[0].header("authorization"), Some(bearer.as_str()));
    assert!(envoy.stat("cluster.secure.ssl.handshake").await.unwrap_or(0) >= 1);

    // The fleet check reads /props from each host through its own cluster, over TLS too (the engines are
    // reachable only through their TLS fronts).
    let probe = llmroute_core::envoy_contract::discovered_probe_cluster("secure");
    let probed = wait_for(Duration::from_secs(20), || async {
        fleet
            .engines
            .iter()
            .all(|e| e.requests().iter().any(|r| r.path == "/props"))
    })
    .await;
    assert!(
        probed.is_some(),
        "the fleet check never read the hosts:\n{}",
        envoy.log()
    );
    let handshakes = envoy.stat(&format!("cluster.{probe}.ssl.handshake")).await;
    assert!(handshakes >= Some(1), "{probe}: {handshakes:?}");
    for f in &fronts {
        let snis = f.snis();
        assert!(!snis.is_empty());
        assert!(
            snis.iter().all(|s| s.as_deref() == Some("backend.internal")),
            "{snis:?}"
        );
    }
}
