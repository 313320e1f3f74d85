//! Request heads, parsed with httparse from the bytes a connection has sent so far.

/// What the front needs of a request head.
#[derive(Debug, PartialEq)]
pub struct Head {
    pub method: String,
    /// Without the query string.
    pub path: String,
    pub authorization: Option<String>,
    /// Declared body length (0 when absent).
    pub content_length: usize,
    /// `Transfer-Encoding` was given (a chunked body, which the front does not read).
    pub chunked: bool,
    /// The client sent `Expect: 100-continue` and waits for a go-ahead before the body.
    pub expect_continue: bool,
    /// The client may send another request on this connection (HTTP/1.1 without
    /// `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`).
    pub keep_alive: bool,
    /// Bytes of the head, the body starts after them.
    pub len: usize,
}

#[derive(Debug, PartialEq)]
pub enum Parsed {
    Complete(Head),
    /// More bytes needed.
    Partial,
    /// Not HTTP, or a Content-Length that does not parse: 400.
    Invalid(&'static str),
}

/// Headers beyond this many: 431 (as over the head size limit).
pub const MAX_HEADERS: usize = 64;

pub fn parse(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::Invalid("too many headers"),
        Err(_) => return Parsed::Invalid("malformed request head"),
    };
    let http10 = req.version == Some(0);
    let mut head = Head {
        method: req.method.unwrap_or("").to_string(),
        path: req
            .path
            .unwrap_or("")
            .split('?')
            .next()
            .unwrap_or("")
            .to_string(),
        authorization: None,
        content_length: 0,
        chunked: false,
        expect_continue: false,
        keep_alive: !http10,
        len,
    };
    for h in req.headers.iter() {
        let value = String::from_utf8_lossy(h.value);
        let value = value.trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            match value.parse() {
                Ok(n) => head.content_length = n,
                Err(_) => return Parsed::Invalid("Content-Length is not a number"),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = !value.eq_ignore_ascii_case("identity");
        } else if h.name.eq_ignore_ascii_case("authorization") {
            head.authorization = Some(value.to_string());
        } else if h.name.eq_ignore_ascii_case("expect") {
            head.expect_continue = value.eq_ignore_ascii_case("100-continue");
        } else if h.name.eq_ignore_ascii_case("connection") {
            let has = |t: &str| value.split(',').any(|v| v.trim().eq_ignore_ascii_case(t));
            if has("close") {
                head.keep_alive = false;
            } else if has("keep-alive") {
                head.keep_alive = true;
            }
        }
    }
    Parsed::Complete(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_front_needs() {
        let raw = b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k \r\nContent-Length: 12\r\n\r\n{\"prompt\":1}";
        let Parsed::Complete(h) = parse(raw) else {
            panic!()
        };
        assert_eq!(
            (h.method.as_str(), h.path.as_str()),
            ("POST", "/v1/completions")
        );
        assert_eq!(h.authorization.as_deref(), Some("Bearer k"));
        assert_eq!(h.content_length, 12);
        assert_eq!(&raw[h.len..], b"{\"prompt\":1}");
        assert!(h.keep_alive && !h.chunked && !h.expect_continue);
    }

    #[test]
    fn partial_invalid_and_connection_rules() {
        assert_eq!(parse(b"GET /health HTTP/1.1\r\nHost:"), Parsed::Partial);
        assert_eq!(parse(b""), Parsed::Partial);
        assert!(matches!(
            parse(b"\x16\x03\x01 hello\r\n\r\n"),
            Parsed::Invalid(_)
        ));
        assert!(matches!(
            parse(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
            Parsed::Invalid(_)
        ));
        let head = |raw: &[u8]| match parse(raw) {
            Parsed::Complete(h) => h,
            other => panic!("{other:?}"),
        };
        assert!(!head(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert!(!head(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive);
        let h =
            head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n");
        assert!(h.chunked && h.expect_continue);
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: y\r\n"))
            .collect();
        assert!(matches!(
            parse(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()),
            Parsed::Invalid("too many headers")
        ));
    }
}
