//! What the HTTP/1.1 transport says itself: the infer routes it decodes, the bytes of a
//! response head it writes without hyper (a refusal of a connection over the cap, a
//! rewritten refusal of a head: `h1io`), and the JSON error bodies.

use bytes::Bytes;

use crate::http::{Limits, Reply};

/// A request the connection answers itself: status and message.
#[derive(Debug, PartialEq)]
pub struct Refusal(pub u16, pub String);

pub(crate) fn over(what: &str, setting: &str, value: usize) -> String {
    format!("the {what} exceed {setting} ({value})")
}

/// `POST /v2/models/{m}[/versions/{v}]/infer` with segments of printable ASCII other than
/// `%`, `/` and `?` (as server/http/rest.py's `_INFER_PATH`; others go to the ASGI app).
pub fn infer_path(method: &str, target: &[u8]) -> Option<(String, String)> {
    if method != "POST" {
        return None;
    }
    let path = target.split(|&b| b == b'?').next()?;
    let rest = std::str::from_utf8(path.strip_prefix(b"/v2/models/")?.strip_suffix(b"/infer")?).ok()?;
    let segment = |s: &str| !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'%' && b != b'/' && b != b'?');
    let (model, version) = match rest.split_once("/versions/") {
        Some((model, version)) => (model, version),
        None => (rest, ""),
    };
    (segment(model) && (version.is_empty() || segment(version))).then(|| (model.to_string(), version.to_string()))
}

// --- responses ------------------------------------------------------------------------------

thread_local! {
    static DATE: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((0, String::new())) };
}

/// The Date header's value, made once a second.
pub(crate) fn date() -> String {
    let now = std::time::SystemTime::now();
    let second = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != second {
            *cached = (second, httpdate::fmt_http_date(now));
        }
        cached.1.clone()
    })
}

/// The status line and headers of a response with a body of `length` bytes.
pub fn response_head(status: u16, headers: &[(Bytes, Bytes)], length: usize, close: bool) -> Vec<u8> {
    let reason = hyper::http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
    let mut head = Vec::with_capacity(160);
    head.extend_from_slice(format!("HTTP/1.1 {status} {reason}\r\ndate: {}\r\n", date()).as_bytes());
    for (name, value) in headers {
        if !matches!(name.as_ref(), b"content-length" | b"transfer-encoding" | b"connection" | b"date") {
            head.extend_from_slice(name);
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
        }
    }
    head.extend_from_slice(format!("content-length: {length}\r\n").as_bytes());
    if close {
        head.extend_from_slice(b"connection: close\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

pub(crate) fn json_error(message: &str) -> Bytes {
    Bytes::from(serde_json::to_vec(&serde_json::json!({ "error": message })).expect("a string map serializes"))
}

pub(crate) fn error_reply(refusal: &Refusal) -> Reply {
    Reply {
        status: refusal.0,
        headers: vec![(Bytes::from_static(b"content-type"), Bytes::from_static(b"application/json"))],
        body: json_error(&refusal.1),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::fd::RawFd;
    use std::time::Duration;

    /// Small limits for the HTTP tests (this module's and `http.rs`'s).
    pub(crate) fn limits() -> Limits {
        Limits {
            max_request_bytes: 1000,
            max_header_bytes: 200,
            max_header_count: 4,
            header_timeout: Duration::from_millis(400),
            body_timeout: Duration::from_millis(400),
            keep_alive_timeout: Duration::from_millis(300),
            admission_timeout: Duration::from_millis(200),
            max_connections: 100,
            max_descriptor: RawFd::MAX,
        }
    }

    #[test]
    fn infer_paths_are_those_the_rest_front_end_serves() {
        assert_eq!(infer_path("POST", b"/v2/models/m/infer"), Some(("m".into(), "".into())));
        assert_eq!(infer_path("POST", b"/v2/models/m/versions/3/infer?x=1"), Some(("m".into(), "3".into())));
        for (method, path) in [("GET", "/v2/models/m/infer"), ("POST", "/v2/models/%6D/infer"), ("POST", "/v2/models//infer"), ("POST", "/v2/models/a/b/infer"), ("POST", "/v2/models/m/infer/")] {
            assert_eq!(infer_path(method, path.as_bytes()), None, "{method} {path}");
        }
    }
}
