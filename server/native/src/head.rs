//! HTTP/1.1 request heads and response heads: a head parsed (httparse) within the limits as
//! it arrives (414 for the URL, 431 for the head, before more is read), the body's framing
//! (Content-Length or chunked; both, or two lengths, refused), the infer routes, and the
//! bytes of a response head.

use bytes::Bytes;

use crate::http::{Limits, Reply};

// --- request heads --------------------------------------------------------------------------

/// A request line and headers.
#[derive(Debug)]
pub struct Head {
    /// Bytes of the buffer the head took.
    pub length: usize,
    pub method: String,
    pub target: Bytes,
    pub http10: bool,
    /// Header fields, names in lower case.
    pub headers: Vec<(Bytes, Bytes)>,
}

impl Head {
    pub(crate) fn get(&self, name: &[u8]) -> Option<&Bytes> {
        self.headers.iter().find(|(n, _)| n.as_ref() == name).map(|(_, v)| v)
    }

    pub(crate) fn text(&self, name: &[u8]) -> Option<String> {
        self.get(name).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    pub(crate) fn has_token(&self, name: &[u8], token: &str) -> bool {
        self.headers.iter().filter(|(n, _)| n.as_ref() == name).any(|(_, v)| {
            String::from_utf8_lossy(v).split(',').any(|t| t.trim().eq_ignore_ascii_case(token))
        })
    }

    pub(crate) fn keep_alive(&self) -> bool {
        if self.http10 {
            self.has_token(b"connection", "keep-alive")
        } else {
            !self.has_token(b"connection", "close")
        }
    }
}

/// A request the connection answers itself, then closes: status and message.
#[derive(Debug, PartialEq)]
pub struct Refusal(pub u16, pub String);

pub(crate) fn over(what: &str, setting: &str, value: usize) -> String {
    format!("the {what} exceed {setting} ({value})")
}

/// Whether the request URL in `buf` (the request line, maybe cut short) is over `max`.
pub(crate) fn url_over(buf: &[u8], max: usize) -> bool {
    let Some(start) = buf.iter().position(|&b| b == b' ') else { return false };
    let rest = &buf[start + 1..];
    rest.iter().position(|&b| b == b' ' || b == b'\r' || b == b'\n').unwrap_or(rest.len()) > max
}

pub(crate) fn too_large(buf: &[u8], limits: &Limits) -> Refusal {
    if url_over(buf, limits.max_header_bytes) {
        Refusal(414, over("request URL", "max_header_bytes", limits.max_header_bytes))
    } else {
        Refusal(431, over("request line and headers", "max_header_bytes", limits.max_header_bytes))
    }
}

/// The head at the start of `buf` when it is all there (`None`: more is needed).
pub fn parse_head(buf: &[u8], limits: &Limits) -> Result<Option<Head>, Refusal> {
    let mut fields = vec![httparse::EMPTY_HEADER; limits.max_header_count];
    let mut request = httparse::Request::new(&mut fields);
    match request.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() > limits.max_header_bytes => Err(too_large(buf, limits)),
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(length)) if length > limits.max_header_bytes => Err(too_large(buf, limits)),
        Ok(httparse::Status::Complete(length)) => Ok(Some(Head {
            length,
            method: request.method.unwrap_or_default().to_string(),
            target: Bytes::copy_from_slice(request.path.unwrap_or_default().as_bytes()),
            http10: request.version == Some(0),
            headers: request
                .headers
                .iter()
                .map(|h| (Bytes::from(h.name.to_ascii_lowercase()), Bytes::copy_from_slice(h.value)))
                .collect(),
        })),
        Err(httparse::Error::TooManyHeaders) => {
            Err(Refusal(431, over("header lines", "max_header_count", limits.max_header_count)))
        }
        Err(error) => Err(Refusal(400, format!("invalid HTTP request: {error}"))),
    }
}

/// How a request's body is framed.
#[derive(Debug, PartialEq)]
pub(crate) enum Framing {
    Length(usize),
    Chunked,
}

pub(crate) fn framing(head: &Head) -> Result<Framing, Refusal> {
    let lengths: Vec<&Bytes> = head.headers.iter().filter(|(n, _)| n.as_ref() == b"content-length").map(|(_, v)| v).collect();
    if head.get(b"transfer-encoding").is_some() {
        if !lengths.is_empty() {
            return Err(Refusal(400, "invalid HTTP request: both Content-Length and Transfer-Encoding".into()));
        }
        let chunked = head.headers.iter().filter(|(n, _)| n.as_ref() == b"transfer-encoding").last().is_some_and(|(_, v)| {
            String::from_utf8_lossy(v).rsplit(',').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("chunked"))
        });
        return if chunked {
            Ok(Framing::Chunked)
        } else {
            Err(Refusal(501, "Transfer-Encoding other than chunked is not supported".into()))
        };
    }
    let mut length = None;
    for value in lengths {
        let parsed = std::str::from_utf8(value)
            .ok()
            .filter(|t| !t.is_empty() && t.len() <= 19 && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<usize>().ok());
        match (parsed, length) {
            (None, _) => return Err(Refusal(400, "invalid HTTP request: malformed Content-Length".into())),
            (Some(n), Some(m)) if n != m => return Err(Refusal(400, "invalid HTTP request: conflicting Content-Length".into())),
            (Some(n), _) => length = Some(n),
        }
    }
    Ok(Framing::Length(length.unwrap_or(0)))
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
    fn heads_are_refused_as_they_pass_the_limits() {
        let limits = limits();
        assert!(parse_head(b"GET /v2 HTTP/1.1\r\nHost: x\r\n", &limits).unwrap().is_none());
        let head = parse_head(b"GET /v2?a=1 HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\nrest", &limits).unwrap().unwrap();
        assert_eq!((head.method.as_str(), &head.target[..], head.length), ("GET", &b"/v2?a=1"[..], 41));
        assert_eq!(head.headers[1], (Bytes::from_static(b"x-a"), Bytes::from_static(b"1")));
        let url = [b"GET /".as_slice(), &[b'a'; 300]].concat(); // the URL alone, still arriving
        assert_eq!(parse_head(&url, &limits).unwrap_err().0, 414);
        let lines = [b"GET / HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 300]].concat();
        let refusal = parse_head(&lines, &limits).unwrap_err();
        assert_eq!(refusal, Refusal(431, "the request line and headers exceed max_header_bytes (200)".into()));
        let many = b"GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n";
        assert_eq!(parse_head(many, &limits).unwrap_err(), Refusal(431, "the header lines exceed max_header_count (4)".into()));
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nno colon\r\n\r\n", &limits).unwrap_err().0, 400);
    }

    #[test]
    fn bodies_are_framed_by_length_or_chunks_and_smuggling_is_refused() {
        let head = |extra: &str| parse_head(format!("POST / HTTP/1.1\r\n{extra}\r\n").as_bytes(), &limits()).unwrap().unwrap();
        assert_eq!(framing(&head("Content-Length: 12\r\n")), Ok(Framing::Length(12)));
        assert_eq!(framing(&head("")), Ok(Framing::Length(0)));
        assert_eq!(framing(&head("Transfer-Encoding: gzip, chunked\r\n")), Ok(Framing::Chunked));
        assert_eq!(framing(&head("Transfer-Encoding: gzip\r\n")).unwrap_err().0, 501);
        for bad in ["Content-Length: 1\r\nTransfer-Encoding: chunked\r\n", "Content-Length: x\r\n", "Content-Length: 1\r\nContent-Length: 2\r\n"] {
            assert_eq!(framing(&head(bad)).unwrap_err().0, 400, "{bad}");
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
