//! edgelm's rules on a request head, checked by the gate (`gate.rs`) with httparse before hyper
//! reads the head. hyper parses and frames every request itself; these rules are the stricter
//! ones it does not apply (it serves a request with both `Content-Length` and
//! `Transfer-Encoding` by the latter, and answers a long target with 431), and what the gate
//! must know to find where the next head starts.

use crate::server::openai::ApiError;

/// Largest request head (431 beyond).
pub const HEAD_LIMIT: usize = 16 * 1024;
/// Longest request target (414 beyond).
pub const TARGET_LIMIT: usize = 8 * 1024;
/// Header fields beyond this many: 431.
pub const MAX_HEADERS: usize = 64;

/// How the body after a head is framed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Framing {
    /// `Content-Length` bytes (0: no body).
    Length(u64),
    /// `Transfer-Encoding: chunked`: the gate cannot tell where the body ends without decoding
    /// it, so the connection closes after this request's answer.
    Chunked,
}

/// What the gate learnt of one head, handed to the request's service in the order of heads.
#[derive(Debug)]
pub struct Facts {
    /// Bytes of the head.
    pub len: usize,
    pub framing: Framing,
    /// The head breaks a rule: the request is answered with this error and the connection
    /// closes (hyper is given a stand-in head, so the answer goes out in order).
    pub refusal: Option<ApiError>,
}

#[derive(Debug)]
pub enum Inspected {
    Complete(Facts),
    /// More bytes needed.
    Partial,
    Refused(ApiError),
}

/// Checks the head at the start of `buf` (which may hold body bytes after it).
pub fn inspect(buf: &[u8]) -> Inspected {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return partial(buf),
        Err(httparse::Error::TooManyHeaders) => return refuse(431, "more than 64 header fields"),
        Err(_) => return refuse(400, "malformed request head"),
    };
    if len > HEAD_LIMIT {
        return refuse(431, "the request head is over 16 KiB");
    }
    if req.path.unwrap_or("").len() > TARGET_LIMIT {
        return refuse(414, "the request target is over 8 KiB");
    }
    let http11 = req.version == Some(1);
    match framing(req.headers, http11) {
        Ok(framing) => Inspected::Complete(Facts {
            len,
            framing,
            refusal: None,
        }),
        Err(e) => Inspected::Refused(e),
    }
}

/// A head not complete yet: refused once it cannot fit the limits any more.
fn partial(buf: &[u8]) -> Inspected {
    let line_done = buf.contains(&b'\n');
    // A method is a short token: a request line this long has an over-long target.
    if !line_done && buf.len() > TARGET_LIMIT + 32 {
        return refuse(414, "the request target is over 8 KiB");
    }
    if buf.len() >= HEAD_LIMIT {
        return refuse(431, "the request head is over 16 KiB");
    }
    Inspected::Partial
}

fn refuse(status: u16, why: &str) -> Inspected {
    Inspected::Refused(ApiError::bad_head(status, why))
}

/// The body's framing, by RFC 9112 §6 with no leniency: `Content-Length` is digits only and
/// every copy agrees; `Transfer-Encoding` is exactly `chunked`, on HTTP/1.1, without
/// `Content-Length`; HTTP/1.1 has exactly one `Host`.
fn framing(headers: &[httparse::Header], http11: bool) -> Result<Framing, ApiError> {
    let bad = |why: &str| Err(ApiError::bad_head(400, why));
    let mut length: Option<u64> = None;
    let mut codings: Vec<String> = Vec::new();
    let mut hosts = 0;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = h.value;
            if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
                return bad("Content-Length must be digits only");
            }
            let n: u64 = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if length.is_some_and(|m| m != n) {
                return bad("Content-Length values disagree");
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            codings.extend(v.split(',').map(|c| c.trim().to_string()));
        } else if h.name.eq_ignore_ascii_case("host") {
            hosts += 1;
        }
    }
    if http11 && hosts != 1 {
        return bad("an HTTP/1.1 request needs exactly one Host header");
    }
    if hosts > 1 {
        return bad("more than one Host header");
    }
    if codings.is_empty() {
        return Ok(Framing::Length(length.unwrap_or(0)));
    }
    if length.is_some() {
        return bad("a request may not carry both Content-Length and Transfer-Encoding");
    }
    if !http11 {
        return bad("Transfer-Encoding is not allowed on HTTP/1.0");
    }
    let chunked = codings.iter().filter(|c| *c == "chunked").count();
    if codings.last().map(String::as_str) != Some("chunked") || chunked > 1 {
        return bad("Transfer-Encoding must end in chunked, applied once");
    }
    if codings.len() > 1 {
        let mut e = ApiError::bad_head(501, "only the chunked transfer coding is supported");
        e.code = Some("unsupported_transfer_coding");
        return Err(e);
    }
    Ok(Framing::Chunked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(raw: &[u8]) -> Option<u16> {
        match inspect(raw) {
            Inspected::Refused(e) => Some(e.status),
            Inspected::Complete(f) => f.refusal.map(|e| e.status),
            Inspected::Partial => panic!("partial: {}", String::from_utf8_lossy(raw)),
        }
    }

    fn facts(raw: &[u8]) -> Facts {
        match inspect(raw) {
            Inspected::Complete(f) => f,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_plain_head_gives_its_length_and_framing() {
        let raw =
            b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n{\"prompt\":1}";
        let f = facts(raw);
        assert_eq!(&raw[f.len..], b"{\"prompt\":1}");
        assert_eq!(f.framing, Framing::Length(12));
        let f = facts(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(f.framing, Framing::Chunked);
        assert_eq!(facts(b"GET / HTTP/1.0\r\n\r\n").framing, Framing::Length(0));
        let same = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n";
        assert_eq!(facts(same).framing, Framing::Length(3));
    }

    #[test]
    fn framing_that_two_parsers_could_read_apart_is_refused() {
        let cases: &[(&[u8], u16)] = &[
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
            (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +31\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400),
            (b"\x16\x03\x01 hello\r\n\r\n", 400),
        ];
        for (raw, want) in cases {
            assert_eq!(status(raw), Some(*want), "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn limits_give_431_and_414() {
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: y\r\n"))
            .collect();
        let raw = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        assert_eq!(status(raw.as_bytes()), Some(431));
        let big = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n",
            "y".repeat(HEAD_LIMIT)
        );
        assert_eq!(
            status(big.as_bytes()),
            Some(431),
            "over the limit before its end"
        );
        let long = format!(
            "GET /{} HTTP/1.1\r\nHost: a\r\n\r\n",
            "a".repeat(TARGET_LIMIT)
        );
        assert_eq!(status(long.as_bytes()), Some(414));
        let unfinished = format!("GET /{}", "a".repeat(TARGET_LIMIT + 40));
        assert_eq!(
            status(unfinished.as_bytes()),
            Some(414),
            "the line is not even done"
        );
        assert!(matches!(
            inspect(b"GET / HTTP/1.1\r\nHost:"),
            Inspected::Partial
        ));
        assert!(matches!(inspect(b""), Inspected::Partial));
    }
}
