//! Test-only certificates, generated at run time with `rcgen`: a CA, a server certificate it signs for
//! `localhost`, `127.0.0.1` and any extra names (an upstream SNI, say), and a client certificate it signs (for
//! servers that require one: etcd's `--client-cert-auth`, an mTLS engine front). Every file is PEM.
//!
//! The server certificate may also authenticate a client (EKU `serverAuth` and `clientAuth`): etcd 3.4 started
//! with `--trusted-ca-file` dials its own gRPC port through its gateway presenting its server certificate as a
//! client one, and the member never reports healthy unless that certificate allows it.
//!
//! The TLS tests use a fresh set per test, in a temporary directory. `testdata/tls/` holds one set written by
//! [`TestPki::write`] for the config fixtures (`envoy --mode validate` checks that the files exist); those keys
//! are public and for tests only.

use std::path::{Path, PathBuf};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

/// A CA, one server certificate and one client certificate it signed, as PEM text.
#[derive(Clone, Debug)]
pub struct TestPki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

/// Where [`TestPki::write`] put the files.
#[derive(Clone, Debug)]
pub struct PkiFiles {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
}

impl TestPki {
    /// A new CA, and a server certificate for `localhost`, `127.0.0.1` and `extra_names` (DNS names or IPs).
    pub fn generate(extra_names: &[&str]) -> Result<TestPki, String> {
        let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        names.extend(extra_names.iter().map(|n| n.to_string()));
        Self::generate_for(names)
    }

    /// A new CA, and a server certificate for exactly `names` (DNS names or IPs), say one that does not name the
    /// address it is served from.
    pub fn generate_exact(names: &[&str]) -> Result<TestPki, String> {
        Self::generate_for(names.iter().map(|n| n.to_string()).collect())
    }

    fn generate_for(names: Vec<String>) -> Result<TestPki, String> {
        let err = |e: rcgen::Error| e.to_string();
        let (ca_cert, issuer) = new_ca()?;

        let server_key = KeyPair::generate().map_err(err)?;
        let mut server = CertificateParams::new(names).map_err(err)?;
        server
            .distinguished_name
            .push(DnType::CommonName, "llmroute test server (test only)");
        // clientAuth too: see the module doc (etcd's gateway).
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        server.use_authority_key_identifier_extension = true;
        let server_cert = server.signed_by(&server_key, &issuer).map_err(err)?;

        let client_key = KeyPair::generate().map_err(err)?;
        let mut client = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        client
            .distinguished_name
            .push(DnType::CommonName, "llmroute test client (test only)");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        client.use_authority_key_identifier_extension = true;
        let client_cert = client.signed_by(&client_key, &issuer).map_err(err)?;

        Ok(TestPki {
            ca_pem: ca_cert.pem(),
            cert_pem: server_cert.pem(),
            key_pem: server_key.serialize_pem(),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
        })
    }

    /// Writes `ca.pem`, `server.pem`, `server.key`, `client.pem` and `client.key` (the keys mode 600) into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<PkiFiles> {
        std::fs::create_dir_all(dir)?;
        let files = PkiFiles {
            ca_file: dir.join("ca.pem"),
            cert_file: dir.join("server.pem"),
            key_file: dir.join("server.key"),
            client_cert_file: dir.join("client.pem"),
            client_key_file: dir.join("client.key"),
        };
        std::fs::write(&files.ca_file, &self.ca_pem)?;
        std::fs::write(&files.cert_file, &self.cert_pem)?;
        write_private(&files.key_file, &self.key_pem)?;
        std::fs::write(&files.client_cert_file, &self.client_cert_pem)?;
        write_private(&files.client_key_file, &self.client_key_pem)?;
        Ok(files)
    }
}

fn new_ca() -> Result<(rcgen::Certificate, Issuer<'static, KeyPair>), String> {
    let err = |e: rcgen::Error| e.to_string();
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "llmroute test CA (test only)");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    Ok((ca_cert, Issuer::new(ca, ca_key)))
}

/// A service mesh's certificates, as Istio issues them: a CA, and one certificate per workload identity, whose
/// only name is a SPIFFE URI (`spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/ACCOUNT`), usable as client and server.
#[derive(Clone, Debug)]
pub struct MeshPki {
    pub ca_pem: String,
    /// `(identity, certificate PEM, key PEM)`, in the order asked for.
    pub workloads: Vec<(String, String, String)>,
}

impl MeshPki {
    pub fn generate(identities: &[&str]) -> Result<MeshPki, String> {
        let err = |e: rcgen::Error| e.to_string();
        let (ca_cert, issuer) = new_ca()?;
        let mut workloads = Vec::new();
        for id in identities {
            let key = KeyPair::generate().map_err(err)?;
            let mut p = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
            p.subject_alt_names = vec![SanType::URI(Ia5String::try_from(*id).map_err(err)?)];
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
            p.use_authority_key_identifier_extension = true;
            let cert = p.signed_by(&key, &issuer).map_err(err)?;
            workloads.push((id.to_string(), cert.pem(), key.serialize_pem()));
        }
        Ok(MeshPki {
            ca_pem: ca_cert.pem(),
            workloads,
        })
    }

    /// Writes `ca.pem`, and `workload-N.pem` / `workload-N.key` per identity, into `dir`; returns the CA's path
    /// and each identity's `(certificate, key)` paths.
    pub fn write(&self, dir: &Path) -> std::io::Result<(PathBuf, Vec<(PathBuf, PathBuf)>)> {
        std::fs::create_dir_all(dir)?;
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, &self.ca_pem)?;
        let mut out = Vec::new();
        for (i, (_, cert, key)) in self.workloads.iter().enumerate() {
            let (c, k) = (
                dir.join(format!("workload-{i}.pem")),
                dir.join(format!("workload-{i}.key")),
            );
            std::fs::write(&c, cert)?;
            write_private(&k, key)?;
            out.push((c, k));
        }
        Ok((ca, out))
    }
}

/// Writes a file only its owner can read.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    options.open(path)?.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pem_files() {
        let pki = TestPki::generate(&["backend.internal"]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files = pki.write(dir.path()).unwrap();
        let ca = std::fs::read_to_string(&files.ca_file).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
        for (cert, key) in [
            (&files.cert_file, &files.key_file),
            (&files.client_cert_file, &files.client_key_file),
        ] {
            assert!(std::fs::read_to_string(cert)
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----"));
            assert!(std::fs::read_to_string(key).unwrap().contains("PRIVATE KEY-----"));
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(key).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o600);
            }
        }
        assert_ne!(pki.client_cert_pem, pki.cert_pem);
        // Two sets never share a CA.
        assert_ne!(TestPki::generate(&[]).unwrap().ca_pem, pki.ca_pem);
    }

    /// Rewrites `testdata/tls/` (the fixtures' test-only certificates):
    /// `cargo test -p llmroute-harness --lib certs::tests::regenerate_testdata -- --ignored`.
    #[test]
    #[ignore]
    fn regenerate_testdata() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/tls");
        TestPki::generate(&["backend.internal"]).unwrap().write(&dir).unwrap();
    }
}
