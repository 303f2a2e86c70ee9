//! TLS from `llmroute discover` and `llmroute register` to etcd: the upstream `tls` block (`ca_file`, `sni`,
//! `cert_file` with `key_file`) as a rustls client, plugged into ureq through its [`ureq::TlsConnector`] hook.
//!
//! It verifies as the rendered Envoy verifies a backend: the chain must lead to `ca_file` (never a system trust
//! store), and the certificate must name `sni` when given (sent as SNI, matched as a DNS name), else the host of
//! the endpoint (a DNS name, or an IP matched as an IP-address subject alternative name, with no SNI sent). With
//! `cert_file` and `key_file` it presents that client certificate, for an etcd started with `--client-cert-auth`.
//! The PEM files are read once, when the client is made, so a missing or unreadable file fails the command at
//! start-up with the file named. The handshake runs inside `connect`; a server certificate that does not verify
//! fails there, and a client certificate etcd refuses fails there or, under TLS 1.3, at the first read (etcd's
//! `bad certificate` alert). Either way it is an error of that endpoint, and the client tries the next one.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use llmroute_core::config::UpstreamTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use ureq::ReadWrite;

/// The rustls client for one `tls` block; hand it to `ureq::AgentBuilder::tls_connector`.
pub struct Connector {
    config: Arc<ClientConfig>,
    /// `sni`, when given: the one name every endpoint's certificate must carry.
    sni: Option<ServerName<'static>>,
}

impl Connector {
    /// Reads `t`'s PEM files and builds the client; the error names the file and what is wrong with it.
    pub fn new(t: &UpstreamTls) -> Result<Connector, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(certificates("tls.ca_file", &t.ca_file)?);
        if added == 0 {
            return Err(format!("tls.ca_file {}: no usable CA certificate in it", t.ca_file));
        }
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        let config = match &t.client_cert {
            None => builder.with_no_client_auth(),
            Some(c) => {
                let chain = certificates("tls.cert_file", &c.cert_file)?;
                let key = PrivateKeyDer::from_pem_file(&c.key_file)
                    .map_err(|e| format!("tls.key_file {}: no PEM private key read: {e}", c.key_file))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("tls.cert_file {} with tls.key_file {}: {e}", c.cert_file, c.key_file))?
            }
        };
        let sni = match &t.sni {
            Some(name) => Some(ServerName::try_from(name.clone()).map_err(|e| format!("tls.sni {name}: {e}"))?),
            None => None,
        };
        Ok(Connector {
            config: Arc::new(config),
            sni,
        })
    }
}

/// Every certificate of the PEM file at `path` (the value of `field`); at least one.
fn certificates(field: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{field} {path}: no PEM certificate read: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{field} {path}: holds no PEM certificate"));
    }
    Ok(certs)
}

impl ureq::TlsConnector for Connector {
    fn connect(&self, host: &str, io: Box<dyn ReadWrite>) -> Result<Box<dyn ReadWrite>, ureq::Error> {
        let name = match &self.sni {
            Some(n) => n.clone(),
            None => ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string())
                .map_err(|e| io_error(format!("{host}: not a name a certificate can carry: {e}")))?,
        };
        let conn = ClientConnection::new(self.config.clone(), name).map_err(|e| io_error(e.to_string()))?;
        let mut stream = StreamOwned::new(conn, io);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(Box::new(TlsStream(stream)))
    }
}

fn io_error(msg: String) -> ureq::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, msg).into()
}

/// One TLS connection to an etcd member.
struct TlsStream(StreamOwned<ClientConnection, Box<dyn ReadWrite>>);

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream").field("sock", &self.0.sock).finish()
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl ReadWrite for TlsStream {
    fn socket(&self) -> Option<&TcpStream> {
        self.0.sock.socket()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmroute_core::config::CertKey;

    fn tls(ca: &str) -> UpstreamTls {
        UpstreamTls {
            sni: None,
            ca_file: ca.into(),
            client_cert: None,
        }
    }

    fn repo(path: &str) -> String {
        format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn the_test_pki_makes_a_client_with_and_without_a_certificate() {
        assert!(Connector::new(&tls(&repo("testdata/tls/ca.pem"))).is_ok());
        let mut t = tls(&repo("testdata/tls/ca.pem"));
        t.client_cert = Some(CertKey {
            cert_file: repo("testdata/tls/client.pem"),
            key_file: repo("testdata/tls/client.key"),
        });
        t.sni = Some("etcd.internal".into());
        assert!(Connector::new(&t).is_ok());
    }

    #[test]
    fn a_missing_or_wrong_file_is_named() {
        let err = Connector::new(&tls("/nonexistent/ca.pem")).err().unwrap();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        // A key is not a certificate.
        let err = Connector::new(&tls(&repo("testdata/tls/client.key"))).err().unwrap();
        assert!(err.contains("client.key"), "{err}");
        let mut t = tls(&repo("testdata/tls/ca.pem"));
        t.client_cert = Some(CertKey {
            cert_file: repo("testdata/tls/client.pem"),
            key_file: repo("testdata/tls/client.pem"),
        });
        let err = Connector::new(&t).err().unwrap();
        assert!(err.contains("tls.key_file") && err.contains("client.pem"), "{err}");
    }
}
