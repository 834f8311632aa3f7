//! The byte stream under hyper's HTTP/1.1 server (module `http`).
//!
//! hyper refuses a request head it cannot take itself, before any service sees it: 400 for
//! a malformed one, 431 for one over `max_header_bytes` or `max_header_count` (while it
//! arrives, before more is read), 414 for a URL past its own bound; it writes those answers
//! with an empty body and closes.  This stream gives them the JSON error body every other
//! refusal of the server carries, naming the setting the request passed: reading, it
//! follows each request head (its request line's URL, its header lines) while no request is
//! being served, so an endless URL is told apart (414) from endless headers (431); writing,
//! it recognises hyper's own refusal (a 400, 414 or 431 with `content-length: 0` while no
//! request is in progress: the service's answers all have bodies) and writes ours instead.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::conn::Watched;
use crate::head::{error_reply, over, response_head, Refusal};

/// Where the reader is in the request head it follows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    Method,
    Url,
    /// Past the URL; `at_start`: at the start of a line (two in a row end the head).
    Lines { at_start: bool },
    /// The head ended (or the reader lost it): nothing more is followed.
    Done,
}

/// What the reader learnt of the request head in progress.
#[derive(Debug)]
pub struct HeadScan {
    place: Place,
    url: usize,
    lines: usize,
    /// Calls ended when this head's scan began (a change: a new head begins).
    epoch: usize,
}

impl HeadScan {
    fn new() -> Self {
        HeadScan { place: Place::Method, url: 0, lines: 0, epoch: 0 }
    }

    /// Follow `bytes`, read while no request is in progress.
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.place = match (self.place, b) {
                (Place::Done, _) => return,
                (Place::Method, b' ') => Place::Url,
                (Place::Method, b'\r' | b'\n') => Place::Method, // empty lines before a request
                (Place::Method, _) => Place::Method,
                (Place::Url, b' ' | b'\r' | b'\n') => Place::Lines { at_start: b == b'\n' },
                (Place::Url, _) => {
                    self.url += 1;
                    Place::Url
                }
                (Place::Lines { .. }, b'\r') => self.place,
                (Place::Lines { at_start: true }, b'\n') => Place::Done,
                (Place::Lines { at_start: false }, b'\n') => Place::Lines { at_start: true },
                (Place::Lines { at_start: true }, _) => {
                    self.lines += 1;
                    Place::Lines { at_start: false }
                }
                (Place::Lines { at_start: false }, _) => self.place,
            };
        }
    }
}

/// The stream hyper serves a connection on (see the module documentation).
pub struct Http1Io {
    inner: Watched,
    max_header_bytes: usize,
    max_header_count: usize,
    scan: HeadScan,
    /// Bytes written before anything else: a refusal rewritten, not all sent yet.
    pending: Vec<u8>,
    sent: usize,
}

impl Http1Io {
    pub fn new(inner: Watched, max_header_bytes: usize, max_header_count: usize) -> Self {
        Http1Io { inner, max_header_bytes, max_header_count, scan: HeadScan::new(), pending: Vec::new(), sent: 0 }
    }

    /// The refusal hyper's `status` stands for, as this server words it.
    fn refusal(&self, status: u16) -> Refusal {
        let (bytes, count) = (self.max_header_bytes, self.max_header_count);
        match status {
            414 => Refusal(414, over("request URL", "max_header_bytes", bytes)),
            // refused while its URL still arrived (or with a URL over the limit alone)
            431 if self.scan.place == Place::Url || self.scan.url > bytes => {
                Refusal(414, over("request URL", "max_header_bytes", bytes))
            }
            431 if self.scan.lines > count => Refusal(431, over("header lines", "max_header_count", count)),
            431 => Refusal(431, over("request line and headers", "max_header_bytes", bytes)),
            _ => Refusal(400, "invalid HTTP request: a malformed request line, header or body framing".into()),
        }
    }

    /// Write what is pending; Ready(Ok) once it is all written.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        Ok(()).into()
    }

    /// `written` (what hyper asked to write) with hyper's own refusal at its end replaced,
    /// when it is there; None else.
    fn rewrite(&self, written: &[u8]) -> Option<Vec<u8>> {
        let (at, status) = own_refusal(written)?;
        let reply = error_reply(&self.refusal(status));
        let mut out = written[..at].to_vec();
        out.extend_from_slice(&response_head(reply.status, &reply.headers, reply.body.len(), true));
        out.extend_from_slice(&reply.body);
        Some(out)
    }

    /// Take `written` as written: `rewritten` goes out in its place.
    fn replace(&mut self, cx: &mut Context<'_>, rewritten: Vec<u8>, written: usize) -> Poll<io::Result<usize>> {
        self.pending = rewritten;
        self.sent = 0;
        if let Poll::Ready(Err(error)) = self.poll_pending(cx) {
            return Poll::Ready(Err(error));
        }
        Poll::Ready(Ok(written)) // the rest goes out on flush
    }

    fn serving(&self) -> bool {
        self.inner.state().active() > 0
    }
}

/// Where hyper's own refusal (a 400, 414 or 431 head with an empty body, ending `written`)
/// begins, and its status.
pub fn own_refusal(written: &[u8]) -> Option<(usize, u16)> {
    if !written.ends_with(b"\r\n\r\n") {
        return None;
    }
    let tail_from = written.len().saturating_sub(512);
    let tail = &written[tail_from..];
    let start = (0..tail.len().saturating_sub(12)).rev().find(|&i| tail[i..].starts_with(b"HTTP/1.1 "))?;
    let head = &tail[start..];
    let status = match &head[9..13] {
        b"400 " => 400,
        b"414 " => 414,
        b"431 " => 431,
        _ => return None,
    };
    let empty = head.windows(19).any(|w| w.eq_ignore_ascii_case(b"content-length: 0\r\n"));
    empty.then_some((tail_from + start, status))
}

impl AsyncRead for Http1Io {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before && !self.serving() {
            let ended = self.inner.state().ended();
            if ended != self.scan.epoch {
                self.scan = HeadScan { epoch: ended, ..HeadScan::new() }; // the next request's head
            }
            self.scan.feed(&buf.filled()[before..]);
        }
        polled
    }
}

impl AsyncWrite for Http1Io {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if !self.serving() {
            if let Some(rewritten) = self.rewrite(buf) {
                return self.replace(cx, rewritten, buf.len());
            }
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if !self.serving() && bufs.iter().rev().find(|b| !b.is_empty()).is_some_and(|last| own_refusal(last).is_some()) {
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            if let Some(rewritten) = self.rewrite(&all) {
                return self.replace(cx, rewritten, all.len());
            }
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(head: &[u8]) -> HeadScan {
        let mut scan = HeadScan::new();
        for piece in head.chunks(3) {
            scan.feed(piece); // as it arrives, a few bytes at a time
        }
        scan
    }

    #[test]
    fn the_head_is_followed_to_its_url_and_header_lines() {
        let scan = scanned(b"GET /abc?d=e HTTP/1.1\r\nHost: x\r\nX-Long: a b c d e f\r\n\r\nbody GET /zzzzzzzzzz");
        assert_eq!((scan.url, scan.lines, scan.place), (8, 2, Place::Done));
        let endless = scanned(&[b"GET /".as_slice(), &[b'a'; 300]].concat());
        assert_eq!((endless.url, endless.place), (301, Place::Url));
        let value = scanned(&[b"POST / HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 300]].concat());
        assert_eq!((value.url, value.lines), (1, 1));
    }

    #[test]
    fn only_hypers_own_empty_refusals_are_recognised() {
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(own_refusal(hyper), Some((0, 431)));
        let after_answer = [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".as_slice(), hyper].concat();
        assert_eq!(own_refusal(&after_answer), Some((40, 431)));
        // the app's own 400 (it has a body), a 404 without one, a body that ends like a head
        assert_eq!(own_refusal(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}"), None);
        assert_eq!(own_refusal(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"), None);
        assert_eq!(own_refusal(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 10\r\n\r\n"), None);
        let body = String::from_utf8(error_reply(&Refusal(431, "x".into())).body.to_vec()).unwrap();
        assert_eq!(body, r#"{"error":"x"}"#);
    }
}
