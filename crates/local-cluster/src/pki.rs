//! The certificates and keys of a local control plane, made fresh for each one.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::Error;

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// Everything the components need to trust and authenticate each other.
pub struct Pki {
    pub ca: Pair,
    pub serving: Pair,
    /// `admin`, in group `system:masters`.
    pub admin: Pair,
    /// `system:kube-controller-manager`, in `system:masters` so that it can act for
    /// every controller when it runs without per-controller service accounts.
    pub controller_manager: Pair,
    /// The key the API server signs service-account tokens with (PKCS#8 PEM),
    /// and its public half, which it verifies them with.
    pub service_account_key_pem: String,
    pub service_account_public_key_pem: String,
}

impl Pki {
    pub fn generate() -> Result<Self, Error> {
        let (ca, issuer) = certificate_authority("cascade-guard local-cluster CA")?;
        let serving = leaf(
            &issuer,
            "kube-apiserver",
            None,
            &["localhost", "kubernetes", "kubernetes.default"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let admin = leaf(
            &issuer,
            "admin",
            Some("system:masters"),
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let controller_manager = leaf(
            &issuer,
            "system:kube-controller-manager",
            Some("system:masters"),
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let sa_key = KeyPair::generate().map_err(pki_error("service-account key"))?;
        Ok(Self {
            ca,
            serving,
            admin,
            controller_manager,
            service_account_key_pem: sa_key.serialize_pem(),
            service_account_public_key_pem: sa_key.public_key_pem(),
        })
    }
}

/// A CA and a certificate signed by it for a server on loopback (localhost
/// and 127.0.0.1), such as a test's admission webhook: (CA, serving).
pub(crate) fn loopback_serving(ca_name: &str, server_name: &str) -> Result<(Pair, Pair), Error> {
    let (ca, issuer) = certificate_authority(ca_name)?;
    Ok((ca, loopback_server(&issuer, server_name)?))
}

fn loopback_server(issuer: &Issuer<'_, KeyPair>, name: &str) -> Result<Pair, Error> {
    leaf(
        issuer,
        name,
        None,
        &["localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    )
}

/// A CA, a server certificate for loopback and a client certificate, both
/// signed by it: the mutual TLS between Crossplane and its functions, where
/// each side trusts only that CA. (CA, server, client).
pub(crate) fn loopback_mutual(
    ca_name: &str,
    server_name: &str,
    client_name: &str,
) -> Result<(Pair, Pair, Pair), Error> {
    let (ca, issuer) = certificate_authority(ca_name)?;
    let server = loopback_server(&issuer, server_name)?;
    let client = leaf(
        &issuer,
        client_name,
        None,
        &[],
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    Ok((ca, server, client))
}

fn certificate_authority(common_name: &str) -> Result<(Pair, Issuer<'static, KeyPair>), Error> {
    let ca_key = KeyPair::generate().map_err(pki_error("CA key"))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(pki_error("CA"))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(pki_error("CA"))?;
    let ca = Pair {
        cert_pem: ca_cert.pem(),
        key_pem: ca_key.serialize_pem(),
    };
    Ok((ca, Issuer::new(ca_params, ca_key)))
}

fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    common_name: &str,
    organization: Option<&str>,
    dns_names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> Result<Pair, Error> {
    let key = KeyPair::generate().map_err(pki_error(common_name))?;
    let names: Vec<String> = dns_names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).map_err(pki_error(common_name))?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        params
            .distinguished_name
            .push(DnType::OrganizationName, org);
    }
    if usage == ExtendedKeyUsagePurpose::ServerAuth {
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let cert = params
        .signed_by(&key, issuer)
        .map_err(pki_error(common_name))?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn pki_error(what: &str) -> impl Fn(rcgen::Error) -> Error + '_ {
    move |source| Error::Certificate {
        what: what.to_string(),
        source,
    }
}
