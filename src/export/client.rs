//! The next hop: the downstream endpoint over gRPC or HTTP, its TLS, the compressor kept
//! from one batch to the next ([`Packer`]), and what an answer's partial success amounts to.
//!
//! Edge.

use super::grpc::send_grpc;
use super::http::{send_http, signal_url};
use super::Sent;
use crate::config::{Compression, ExportProtocol, ExporterTlsConfig, OtlpExporterConfig};
use anyhow::Context as _;
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// The zstd level of OTLP/HTTP batches: 1, the fastest, as gzip's is (`Compression::fast`):
/// most of a batch passes through as it came, and CPU is what forwarding costs.
const ZSTD_LEVEL: i32 = 1;

/// The downstream endpoint, over gRPC or HTTP.
pub enum Downstream {
    /// OTLP/gRPC over this channel, the message compressed by the packer.
    Grpc(tonic::transport::Channel, Packer),
    /// OTLP/HTTP protobuf, to this URL, compressed by the packer.
    Http(reqwest::Client, String, Packer),
}

/// Reads and checks the TLS files `config` names (for an `https://` endpoint), as
/// [`Downstream::new`] does at start: what `refusal-gate validate` runs.
///
/// # Errors
/// Naming the setting and the file that cannot be read or holds no certificate or key.
pub fn check_tls(config: &OtlpExporterConfig, base_dir: &Path) -> anyhow::Result<()> {
    check_next_hop_tls(
        &config.endpoint,
        config.tls.as_ref(),
        "exporters.otlp",
        base_dir,
    )
}

/// [`check_tls`] for any exporter: the TLS files of `section` towards `endpoint`.
///
/// # Errors
/// As [`check_tls`].
pub fn check_next_hop_tls(
    endpoint: &str,
    tls: Option<&ExporterTlsConfig>,
    section: &str,
    base_dir: &Path,
) -> anyhow::Result<()> {
    tls_files(endpoint, tls, section, base_dir).map(drop)
}

/// The TLS files of an `https://` endpoint, read and checked (none named: the built-in
/// roots alone); `None` for a plain `http://` one. `section` names the exporter in errors.
fn tls_files(
    endpoint: &str,
    tls: Option<&ExporterTlsConfig>,
    section: &str,
    base_dir: &Path,
) -> anyhow::Result<Option<TlsFiles>> {
    if !endpoint.starts_with("https://") {
        return Ok(None);
    }
    let none = ExporterTlsConfig::default();
    TlsFiles::read(tls.unwrap_or(&none), section, base_dir).map(Some)
}

/// A lazily connecting gRPC channel to `endpoint`, with TLS for `https://` (files of
/// `section`'s `tls`, read from `base_dir`).
///
/// # Errors
/// When the endpoint is not a valid URI, or a TLS file cannot be read or used.
pub fn grpc_channel(
    endpoint: &str,
    tls: Option<&ExporterTlsConfig>,
    section: &str,
    timeout: std::time::Duration,
    base_dir: &Path,
) -> anyhow::Result<tonic::transport::Channel> {
    let files = tls_files(endpoint, tls, section, base_dir)?;
    let mut channel =
        tonic::transport::Endpoint::from_shared(endpoint.to_owned())?.connect_timeout(timeout);
    if let Some(files) = files {
        channel = channel
            .tls_config(files.grpc())
            .with_context(|| format!("cannot use {section}.tls"))?;
    }
    Ok(channel.connect_lazy())
}

/// An HTTP client for `endpoint`, with TLS for `https://` as [`grpc_channel`].
///
/// # Errors
/// When a TLS file cannot be read or used, or the client cannot be built.
pub fn http_client(
    endpoint: &str,
    tls: Option<&ExporterTlsConfig>,
    section: &str,
    base_dir: &Path,
) -> anyhow::Result<reqwest::Client> {
    // OTLP requests are never redirected: a redirect is an answer like any other non-2xx
    // (following one would send the body elsewhere, or as a bodiless GET).
    let mut client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(files) = tls_files(endpoint, tls, section, base_dir)? {
        client = files
            .http(client)
            .with_context(|| format!("cannot use {section}.tls"))?;
    }
    Ok(client.build()?)
}

/// An error with every cause under it, `: `-separated: what a failed send says (a refused
/// connection, a certificate not trusted, a timeout), not only that it failed.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// The PEM files of `exporters.otlp.tls`, read: what either client is built with.
struct TlsFiles {
    /// The CA certificates to trust instead of the built-in roots.
    ca: Option<Vec<u8>>,
    /// The client certificate chain and its key (mTLS).
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// Reads the files `tls` names, relative to `base_dir`, and checks that each holds what
    /// it should: neither client would say so before its first send.
    fn read(tls: &ExporterTlsConfig, section: &str, base_dir: &Path) -> anyhow::Result<TlsFiles> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certificates = |pem: &[u8]| {
            let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>();
            match certs.map_err(|e| e.to_string())? {
                certs if certs.is_empty() => Err("no PEM certificate in it".to_owned()),
                _ => Ok(()),
            }
        };
        let key = |pem: &[u8]| {
            PrivateKeyDer::from_pem_slice(pem)
                .map(drop)
                .map_err(|e| e.to_string())
        };
        let read =
            |setting: &str, file: &Option<PathBuf>, check: &dyn Fn(&[u8]) -> Result<(), String>| {
                let Some(file) = file else { return Ok(None) };
                let path = base_dir.join(file);
                let bytes = std::fs::read(&path).map_err(|e| e.to_string());
                match bytes.and_then(|b| check(&b).map(|()| b)) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(problem) => Err(anyhow::anyhow!(
                        "{section}.tls.{setting} {}: {problem}",
                        path.display()
                    )),
                }
            };
        let (cert, key) = (
            read("cert_file", &tls.cert_file, &certificates)?,
            read("key_file", &tls.key_file, &key)?,
        );
        Ok(TlsFiles {
            ca: read("ca_file", &tls.ca_file, &certificates)?,
            identity: cert.zip(key),
        })
    }

    /// tonic's TLS settings: the CA file or else the built-in roots, and the identity.
    fn grpc(self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let tls = match self.ca {
            Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
            None => ClientTlsConfig::new().with_webpki_roots(),
        };
        match self.identity {
            Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
            None => tls,
        }
    }

    /// The same for reqwest, whose built-in roots are the same (webpki) ones.
    fn http(self, mut client: reqwest::ClientBuilder) -> anyhow::Result<reqwest::ClientBuilder> {
        if let Some(ca) = self.ca {
            client = client
                .tls_built_in_root_certs(false)
                .add_root_certificate(reqwest::Certificate::from_pem(&ca)?);
        }
        if let Some((mut pem, key)) = self.identity {
            pem.push(b'\n');
            pem.extend_from_slice(&key);
            client = client.identity(reqwest::Identity::from_pem(&pem)?);
        }
        Ok(client)
    }
}

/// The requests of one batch, sent one after another as they are: concatenated protobuf
/// messages merge, so the next hop reads one request.
pub type Batch = Vec<Bytes>;

/// The compressor of the exporter's batches, OTLP/HTTP bodies and gRPC messages alike, kept
/// from one batch to the next: gzip's window and hash tables, or zstd's context, are reset
/// rather than allocated and built again. Each request of a batch is fed to it as it is,
/// never concatenated first.
pub enum Packer {
    /// `compression: none`.
    None,
    /// gzip at level 1 (`Compression::fast`).
    Gzip(Box<flate2::Compress>),
    /// zstd at level 1 (`ZSTD_LEVEL`).
    Zstd(Box<zstd::stream::raw::Encoder<'static>>),
}

/// How much room the compressed body gains at a time while it grows.
const PACK_GROWTH: usize = 64 << 10;

impl Packer {
    /// A compressor for `compression`.
    ///
    /// # Errors
    /// When zstd cannot set up its context (out of memory).
    pub fn new(compression: Compression) -> std::io::Result<Packer> {
        Ok(match compression {
            Compression::None => Packer::None,
            Compression::Gzip => Packer::Gzip(Box::new(flate2::Compress::new_gzip(
                flate2::Compression::fast(),
                15,
            ))),
            Compression::Zstd => {
                Packer::Zstd(Box::new(zstd::stream::raw::Encoder::new(ZSTD_LEVEL)?))
            }
        })
    }

    /// The `Content-Encoding` of what [`Packer::pack`] makes; `None` when it does not compress.
    pub fn encoding(&self) -> Option<&'static str> {
        match self {
            Packer::None => None,
            Packer::Gzip(_) => Some("gzip"),
            Packer::Zstd(_) => Some("zstd"),
        }
    }

    /// The batch compressed, one stream (a gzip member, a zstd frame) for the whole of it;
    /// for [`Packer::None`] the requests one after another.
    ///
    /// # Errors
    /// When the compressor fails (it does not on a `Vec`, short of memory).
    pub fn pack(&mut self, batch: &Batch) -> std::io::Result<Vec<u8>> {
        let size: usize = batch.iter().map(Bytes::len).sum();
        match self {
            Packer::None => Ok(batch.concat()),
            Packer::Gzip(gz) => {
                use flate2::{FlushCompress, Status};
                gz.reset();
                let mut out = Vec::with_capacity(size / 8 + PACK_GROWTH);
                for part in batch {
                    let mut input: &[u8] = part;
                    while !input.is_empty() {
                        out.reserve(PACK_GROWTH);
                        let before = gz.total_in();
                        gz.compress_vec(input, &mut out, FlushCompress::None)?;
                        let taken = usize::try_from(gz.total_in() - before).unwrap_or(usize::MAX);
                        input = &input[taken.min(input.len())..];
                    }
                }
                loop {
                    out.reserve(PACK_GROWTH);
                    if gz.compress_vec(&[], &mut out, FlushCompress::Finish)? == Status::StreamEnd {
                        return Ok(out);
                    }
                }
            }
            Packer::Zstd(z) => {
                use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
                z.reinit()?;
                // The size up front lets zstd fit its tables to the batch, as a one-shot
                // compression does.
                z.set_pledged_src_size(Some(size as u64))?;
                let mut out = Vec::with_capacity(size / 8 + PACK_GROWTH);
                for part in batch {
                    let mut input = InBuffer::around(part);
                    while input.pos < part.len() {
                        out.reserve(PACK_GROWTH);
                        let at = out.len();
                        z.run(&mut input, &mut OutBuffer::around_pos(&mut out, at))?;
                    }
                }
                loop {
                    out.reserve(PACK_GROWTH);
                    let at = out.len();
                    if z.finish(&mut OutBuffer::around_pos(&mut out, at), true)? == 0 {
                        return Ok(out);
                    }
                }
            }
        }
    }
}

impl Downstream {
    /// A client for `config` (connects lazily), its TLS files read from `base_dir`.
    ///
    /// # Errors
    /// When the endpoint is not a valid URI, a TLS file cannot be read or used, or the HTTP
    /// client cannot be built.
    pub fn new(config: &OtlpExporterConfig, base_dir: &Path) -> anyhow::Result<Downstream> {
        let (endpoint, tls, section) = (&config.endpoint, config.tls.as_ref(), "exporters.otlp");
        match config.protocol {
            ExportProtocol::Grpc => Ok(Downstream::Grpc(
                grpc_channel(endpoint, tls, section, config.timeout, base_dir)?,
                Packer::new(config.compression)?,
            )),
            ExportProtocol::HttpProtobuf => Ok(Downstream::Http(
                http_client(endpoint, tls, section, base_dir)?,
                signal_url(endpoint, "/v1/traces"),
                Packer::new(config.compression)?,
            )),
        }
    }

    pub(super) async fn send(&mut self, config: &OtlpExporterConfig, body: Batch) -> Sent {
        match self {
            Downstream::Grpc(channel, packer) => send_grpc(channel, packer, config, body).await,
            Downstream::Http(client, url, packer) => {
                send_http(client, url, packer, config, body).await
            }
        }
    }
}

pub(super) fn partial(response: &ExportTraceServiceResponse) -> Sent {
    let (rejected, message) = response
        .partial_success
        .as_ref()
        .map_or((0, String::new()), |p| {
            (
                u64::try_from(p.rejected_spans).unwrap_or(0),
                p.error_message.clone(),
            )
        });
    Sent::Ok { rejected, message }
}

/// The largest answer the exporter reads from the next hop (an `ExportTraceServiceResponse` is
/// a few bytes; tonic's client decodes at most 4 MiB by default): past it the send is final.
pub(super) const MAX_ANSWER: usize = 4 << 20;

/// What refusal-gate calls itself on its outbound requests.
pub(super) const USER_AGENT: &str = concat!("refusal-gate/", env!("CARGO_PKG_VERSION"));

/// A request body of parts sent one after another as they are, with its exact length.
pub(super) struct Parts {
    parts: VecDeque<Bytes>,
    left: u64,
}

impl Parts {
    pub(super) fn new(parts: Vec<Bytes>) -> Parts {
        let left = parts.iter().map(|p| p.len() as u64).sum();
        Parts {
            parts: parts.into(),
            left,
        }
    }
}

impl http_body::Body for Parts {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let next = self.parts.pop_front();
        if let Some(part) = &next {
            self.left -= part.len() as u64;
        }
        std::task::Poll::Ready(next.map(|part| Ok(http_body::Frame::data(part))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}
