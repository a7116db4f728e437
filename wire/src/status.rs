//! Runtime errors across the gRPC boundary. A gRPC status has a code and a message; a caller that only had those
//! would see every refusal as one kind of error. So a status also carries the error's kind in its metadata
//! (`ws-error-kind: protocol|data|out-of-sram|over-limit|unavailable|spec|io`), with the fields of the structured kinds
//! beside it, and [`from_status`] gives back the same [`Error`] variant on the calling side: an engine out of
//! SRAM stays [`Error::OutOfSram`] with its numbers through every SwarmX hop to MemoryX.
//!
//! A status without a kind did not come from [`to_status`] (tonic made it for a failed connection, or the
//! stream broke): its code alone decides, and a transport failure becomes [`Error::Unavailable`], which the
//! training loop answers by rerunning the step.
//!
//! Each hop prefixes the peer it heard the error from, as the message always has: to the message of the
//! string kinds, to the engine of [`Error::OutOfSram`], to the context of [`Error::Io`] and to the message of
//! [`Error::Spec`].

use tonic::metadata::{AsciiMetadataValue, BinaryMetadataValue, MetadataMap};
use tonic::{Code, Status};

use errors::Error;

/// The metadata entry that names the error's kind.
pub const KIND_KEY: &str = "ws-error-kind";

// The fields of the structured kinds. Free text travels in binary entries (`-bin`), which carry any UTF-8.
const SRAM_ENGINE: &str = "ws-sram-engine-bin";
const SRAM_WHAT: &str = "ws-sram-what-bin";
const SRAM_NEEDED: &str = "ws-sram-needed";
const SRAM_AVAILABLE: &str = "ws-sram-available";
const LIMIT_WHAT: &str = "ws-limit-what-bin";
const LIMIT_VALUE: &str = "ws-limit-value";
const LIMIT_MAX: &str = "ws-limit-max";
const MODEL_OP: &str = "ws-model-op-bin";
const MODEL_AT: &str = "ws-model-at-bin";
const MODEL_WHY: &str = "ws-model-why-bin";
const IO_CONTEXT: &str = "ws-io-context-bin";
const IO_SOURCE: &str = "ws-io-source-bin";
const IO_KIND: &str = "ws-io-kind";
const SPEC_KIND: &str = "ws-spec-kind";
const SPEC_AT: &str = "ws-spec-at-bin";
const SPEC_MESSAGE: &str = "ws-spec-message-bin";

/// The kinds of [`Error`], as they are named on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Protocol,
    Data,
    OutOfSram,
    OverLimit,
    Unavailable,
    Spec,
    Io,
    Identity,
    Plan,
    UnsupportedModel,
    Stopped,
}

impl Kind {
    const ALL: [Kind; 11] = [
        Kind::Protocol,
        Kind::Data,
        Kind::OutOfSram,
        Kind::OverLimit,
        Kind::Unavailable,
        Kind::Spec,
        Kind::Io,
        Kind::Identity,
        Kind::Plan,
        Kind::UnsupportedModel,
        Kind::Stopped,
    ];

    fn of(e: &Error) -> Kind {
        match e {
            Error::Protocol(_) => Kind::Protocol,
            Error::Data(_) => Kind::Data,
            Error::OutOfSram { .. } => Kind::OutOfSram,
            Error::OverLimit { .. } => Kind::OverLimit,
            Error::Unavailable(_) => Kind::Unavailable,
            Error::Spec(_) => Kind::Spec,
            Error::Io { .. } => Kind::Io,
            Error::Identity(_) => Kind::Identity,
            Error::Plan(_) => Kind::Plan,
            Error::UnsupportedModel { .. } => Kind::UnsupportedModel,
            Error::Stopped { .. } => Kind::Stopped,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Protocol => "protocol",
            Kind::Data => "data",
            Kind::OutOfSram => "out-of-sram",
            Kind::OverLimit => "over-limit",
            Kind::Unavailable => "unavailable",
            Kind::Spec => "spec",
            Kind::Io => "io",
            Kind::Identity => "identity",
            Kind::Plan => "plan",
            Kind::UnsupportedModel => "unsupported-model",
            Kind::Stopped => "stopped",
        }
    }

    fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// The I/O error kinds that keep their kind across the wire (named by their `Debug` form); any other arrives
/// as `Other`.
const IO_KINDS: [std::io::ErrorKind; 14] = {
    use std::io::ErrorKind::*;
    [
        NotFound,
        PermissionDenied,
        AlreadyExists,
        InvalidInput,
        InvalidData,
        TimedOut,
        UnexpectedEof,
        WriteZero,
        Interrupted,
        Unsupported,
        OutOfMemory,
        StorageFull,
        ReadOnlyFilesystem,
        Other,
    ]
};

/// The status a role answers with for an error: the code keeps "unavailable" apart from "refused" for any
/// gRPC client, and the metadata keeps the exact kind and its fields for [`from_status`].
pub fn to_status(e: Error) -> Status {
    let mut md = MetadataMap::new();
    md.insert(KIND_KEY, AsciiMetadataValue::from_static(Kind::of(&e).name()));
    let text = |s: &str| BinaryMetadataValue::from_bytes(s.as_bytes());
    let (code, message) = match e {
        Error::Unavailable(m) => (Code::Unavailable, m),
        Error::Protocol(m) => (Code::InvalidArgument, m),
        Error::Data(m) => (Code::Internal, m),
        Error::Plan(m) => (Code::FailedPrecondition, m),
        Error::Identity(m) => (Code::Unauthenticated, m),
        Error::UnsupportedModel { ref op, ref at, ref why } => {
            md.insert_bin(MODEL_OP, text(op));
            md.insert_bin(MODEL_AT, text(at));
            md.insert_bin(MODEL_WHY, text(why));
            (Code::FailedPrecondition, e.to_string())
        }
        // A peer that stops is, to its callers, one that went away: the step is rerun once it is back.
        Error::Stopped { .. } => (Code::Unavailable, e.to_string()),
        Error::OutOfSram { ref engine, ref what, needed, available } => {
            md.insert_bin(SRAM_ENGINE, text(engine));
            md.insert_bin(SRAM_WHAT, text(what));
            md.insert(SRAM_NEEDED, needed.into());
            md.insert(SRAM_AVAILABLE, available.into());
            (Code::ResourceExhausted, e.to_string())
        }
        Error::OverLimit { ref what, value, limit } => {
            md.insert_bin(LIMIT_WHAT, text(what));
            md.insert(LIMIT_VALUE, value.into());
            md.insert(LIMIT_MAX, limit.into());
            (Code::ResourceExhausted, e.to_string())
        }
        Error::Io { ref context, ref source } => {
            md.insert_bin(IO_CONTEXT, text(context));
            md.insert_bin(IO_SOURCE, text(&source.to_string()));
            if let Ok(kind) = AsciiMetadataValue::try_from(format!("{:?}", source.kind())) {
                md.insert(IO_KIND, kind);
            }
            (Code::Internal, e.to_string())
        }
        Error::Spec(ref spec) => {
            let (kind, at, message) = match spec {
                crds::ApiError::Syntax { path, message } => ("syntax", path.as_str(), message.as_str()),
                crds::ApiError::Invalid { field, message } => ("invalid", field.as_str(), message.as_str()),
                crds::ApiError::Internal(message) => ("internal", "", message.as_str()),
            };
            md.insert(SPEC_KIND, AsciiMetadataValue::from_static(kind));
            md.insert_bin(SPEC_AT, text(at));
            md.insert_bin(SPEC_MESSAGE, text(message));
            (Code::Internal, e.to_string())
        }
    };
    Status::with_metadata(code, message, md)
}

/// The error a caller sees for a status from `peer`: the variant the peer failed with when the status names
/// its kind; otherwise transport failures and lost peers become [`Error::Unavailable`] (the step can be
/// rerun) and refusals stay refusals ([`Error::Protocol`]).
pub fn from_status(s: Status, peer: &str) -> Error {
    if let Some(e) = typed(&s, peer) {
        return e;
    }
    match s.code() {
        Code::Unavailable | Code::Cancelled | Code::Aborted | Code::DeadlineExceeded | Code::Unknown => {
            Error::Unavailable(format!("{peer}: {}", s.message()))
        }
        _ => Error::Protocol(format!("{peer}: {}", s.message())),
    }
}

/// The error a status's metadata names, or `None` when it names none (or its fields do not parse).
fn typed(s: &Status, peer: &str) -> Option<Error> {
    let md = s.metadata();
    let ascii = |key: &str| md.get(key).and_then(|v| v.to_str().ok());
    let text = |key: &str| {
        let bytes = md.get_bin(key)?.to_bytes().ok()?;
        String::from_utf8(bytes.to_vec()).ok()
    };
    let from_peer = |m: &str| format!("{peer}: {m}");
    Some(match Kind::parse(ascii(KIND_KEY)?)? {
        Kind::Protocol => Error::Protocol(from_peer(s.message())),
        Kind::Data => Error::Data(from_peer(s.message())),
        Kind::Plan => Error::Plan(from_peer(s.message())),
        Kind::Identity => Error::Identity(from_peer(s.message())),
        Kind::UnsupportedModel => {
            Error::UnsupportedModel { op: text(MODEL_OP)?, at: text(MODEL_AT)?, why: from_peer(&text(MODEL_WHY)?) }
        }
        Kind::Unavailable | Kind::Stopped => Error::Unavailable(from_peer(s.message())),
        Kind::OutOfSram => Error::OutOfSram {
            engine: from_peer(&text(SRAM_ENGINE)?),
            what: text(SRAM_WHAT)?,
            needed: ascii(SRAM_NEEDED)?.parse().ok()?,
            available: ascii(SRAM_AVAILABLE)?.parse().ok()?,
        },
        Kind::OverLimit => Error::OverLimit {
            what: from_peer(&text(LIMIT_WHAT)?),
            value: ascii(LIMIT_VALUE)?.parse().ok()?,
            limit: ascii(LIMIT_MAX)?.parse().ok()?,
        },
        Kind::Io => {
            let kind = ascii(IO_KIND).and_then(|name| IO_KINDS.into_iter().find(|k| format!("{k:?}") == name));
            let kind = kind.unwrap_or(std::io::ErrorKind::Other);
            Error::Io { context: from_peer(&text(IO_CONTEXT)?), source: std::io::Error::new(kind, text(IO_SOURCE)?) }
        }
        Kind::Spec => {
            let (at, message) = (text(SPEC_AT)?, from_peer(&text(SPEC_MESSAGE)?));
            Error::Spec(match ascii(SPEC_KIND)? {
                "syntax" => crds::ApiError::Syntax { path: at, message },
                "invalid" => crds::ApiError::Invalid { field: at, message },
                "internal" => crds::ApiError::Internal(message),
                _ => return None,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use tonic::codegen::http::HeaderMap;

    use super::*;

    /// A status as the peer receives it: through the HTTP/2 headers (trailers) it travels in.
    fn over_the_wire(s: Status) -> Status {
        let mut headers = HeaderMap::new();
        s.add_header(&mut headers).expect("a status with valid headers");
        Status::from_header_map(&headers).expect("the status comes back")
    }

    fn round_trip(e: Error) -> Error {
        from_status(over_the_wire(to_status(e)), "peer")
    }

    #[test]
    fn every_kind_comes_back_as_the_same_variant() {
        match round_trip(Error::Protocol("bad layer".into())) {
            Error::Protocol(m) => assert_eq!(m, "peer: bad layer"),
            other => panic!("{other:?}"),
        }
        match round_trip(Error::Data("truncated — copy it again".into())) {
            Error::Data(m) => assert_eq!(m, "peer: truncated — copy it again"),
            other => panic!("{other:?}"),
        }
        match round_trip(Error::Unavailable("engine-1 went away".into())) {
            Error::Unavailable(m) => assert_eq!(m, "peer: engine-1 went away"),
            other => panic!("{other:?}"),
        }
        // A peer that stopped on a termination signal is, to its caller, unavailable: the step reruns.
        let stopped = Error::Stopped { step: 7, checkpoint: None };
        let said = stopped.to_string();
        match round_trip(stopped) {
            Error::Unavailable(m) => assert_eq!(m, format!("peer: {said}")),
            other => panic!("{other:?}"),
        }
        let sram = Error::OutOfSram {
            engine: "wse-0".into(),
            what: "layer 3's weights".into(),
            needed: 1 << 40,
            available: 123,
        };
        let said = sram.to_string();
        match round_trip(sram) {
            e @ Error::OutOfSram { .. } => {
                assert_eq!(e.to_string(), format!("peer: {said}"), "the message as before, with the peer");
                let Error::OutOfSram { engine, what, needed, available } = e else { unreachable!() };
                assert_eq!(
                    (engine.as_str(), what.as_str(), needed, available),
                    ("peer: wse-0", "layer 3's weights", 1 << 40, 123)
                );
            }
            other => panic!("{other:?}"),
        }
        let over = Error::OverLimit { what: "samples of a BeginStep".into(), value: 8_000_000, limit: 64 };
        match round_trip(over) {
            e @ Error::OverLimit { .. } => {
                assert!(e.to_string().starts_with("peer: samples of a BeginStep is 8000000, beyond the 64"), "{e}");
                let Error::OverLimit { value, limit, .. } = e else { unreachable!() };
                assert_eq!((value, limit), (8_000_000, 64));
            }
            other => panic!("{other:?}"),
        }
        let model = Error::UnsupportedModel {
            op: "aten.fft_fft.default".into(),
            at: "model.py:12 (x = torch.fft.fft(x))".into(),
            why: "no Fourier transform".into(),
        };
        match round_trip(model) {
            Error::UnsupportedModel { op, at, why } => assert_eq!(
                (op.as_str(), at.as_str(), why.as_str()),
                ("aten.fft_fft.default", "model.py:12 (x = torch.fft.fft(x))", "peer: no Fourier transform")
            ),
            other => panic!("{other:?}"),
        }
        let io = Error::io("writing /ckpt/step-1", std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full"));
        match round_trip(io) {
            Error::Io { context, source } => {
                assert_eq!(context, "peer: writing /ckpt/step-1");
                assert_eq!((source.kind(), source.to_string()), (std::io::ErrorKind::StorageFull, "disk full".into()));
            }
            other => panic!("{other:?}"),
        }
        let specs = [
            crds::ApiError::Syntax { path: "spec.model".into(), message: "unknown field".into() },
            crds::ApiError::Invalid { field: "spec.cs2".into(), message: "must be at least 1".into() },
            crds::ApiError::Internal("oops".into()),
        ];
        for spec in specs {
            let want = match &spec {
                crds::ApiError::Syntax { path, message } => {
                    crds::ApiError::Syntax { path: path.clone(), message: format!("peer: {message}") }
                }
                crds::ApiError::Invalid { field, message } => {
                    crds::ApiError::Invalid { field: field.clone(), message: format!("peer: {message}") }
                }
                crds::ApiError::Internal(m) => crds::ApiError::Internal(format!("peer: {m}")),
            };
            match round_trip(Error::Spec(spec)) {
                Error::Spec(back) => assert_eq!(back.to_string(), want.to_string()),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn every_kind_keeps_its_status_code() {
        let code = |e: Error| to_status(e).code();
        assert_eq!(code(Error::Unavailable("x".into())), Code::Unavailable);
        assert_eq!(code(Error::Protocol("x".into())), Code::InvalidArgument);
        let sram = Error::OutOfSram { engine: "e".into(), what: "w".into(), needed: 2, available: 1 };
        assert_eq!(code(sram), Code::ResourceExhausted);
        assert_eq!(code(Error::OverLimit { what: "w".into(), value: 2, limit: 1 }), Code::ResourceExhausted);
        assert_eq!(code(Error::Data("x".into())), Code::Internal);
        assert_eq!(code(Error::io("x", std::io::Error::other("y"))), Code::Internal);
        assert_eq!(code(Error::Spec(crds::ApiError::Internal("x".into()))), Code::Internal);
    }

    #[test]
    fn relaying_keeps_the_kind_and_adds_each_peer() {
        let sram = Error::OutOfSram { engine: "wse-0".into(), what: "activations".into(), needed: 10, available: 5 };
        let at_relay = from_status(over_the_wire(to_status(sram)), "http://wse-0");
        match from_status(over_the_wire(to_status(at_relay)), "http://swarmx") {
            Error::OutOfSram { engine, needed: 10, available: 5, .. } => {
                assert_eq!(engine, "http://swarmx: http://wse-0: wse-0")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_status_without_a_kind_maps_by_its_code() {
        for code in [Code::Unavailable, Code::Cancelled, Code::Aborted, Code::DeadlineExceeded, Code::Unknown] {
            match from_status(over_the_wire(Status::new(code, "connection reset")), "peer") {
                Error::Unavailable(m) => assert_eq!(m, "peer: connection reset"),
                other => panic!("{code:?}: {other:?}"),
            }
        }
        for code in [Code::InvalidArgument, Code::Internal, Code::ResourceExhausted, Code::FailedPrecondition] {
            match from_status(over_the_wire(Status::new(code, "refused")), "peer") {
                Error::Protocol(m) => assert_eq!(m, "peer: refused"),
                other => panic!("{code:?}: {other:?}"),
            }
        }
        // A kind this build does not know, or one whose fields are missing, is treated as no kind.
        let mut unknown = Status::internal("from the future");
        unknown.metadata_mut().insert(KIND_KEY, AsciiMetadataValue::from_static("quantum"));
        assert!(matches!(from_status(unknown, "peer"), Error::Protocol(m) if m == "peer: from the future"));
        let mut bare = Status::resource_exhausted("no fields");
        bare.metadata_mut().insert(KIND_KEY, AsciiMetadataValue::from_static("out-of-sram"));
        assert!(matches!(from_status(bare, "peer"), Error::Protocol(_)));
        let mut lost = Status::unavailable("gone");
        lost.metadata_mut().insert(KIND_KEY, AsciiMetadataValue::from_static("nonsense"));
        assert!(matches!(from_status(lost, "peer"), Error::Unavailable(_)));
    }
}
