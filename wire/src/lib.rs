//! The wire between the roles, with no role in it: the job's identity and TLS, both halves of gRPC (dial and
//! serve, keepalives, windows, deadlines), the one error type's mapping to gRPC statuses and back, the
//! check that a request is of the job, and the scaffold every role program starts from.
//!
//! - [`identity`]: the job's CA and certificates, and the rustls/tonic configurations built from them.
//! - [`grpc`]: [`grpc::Dial`] and [`grpc::channel`] (the client half), [`grpc::serve`] (the server half),
//!   [`grpc::JobGuard`].
//! - [`https`]: the HTTP side over TLS, with routes for the job's holders only.
//! - [`tls`]: accepting and dialing TLS; [`tls::record`], a gRPC connection's records sealed and opened in its
//!   own buffers.
//! - [`status`]: how the kind of an [`errors::Error`] survives a gRPC hop.
//! - [`program`]: one role program's start-up, listeners, HTTP side and service.
#![warn(missing_docs)]

pub mod grpc;
pub mod https;
pub mod identity;
pub mod program;
pub mod status;
pub mod tls;
