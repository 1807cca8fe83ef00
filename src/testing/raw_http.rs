//! [`HttpRequest`]: one HTTP/1.1 request on a fresh connection, as a test
//! sees what a client sees of a node.
//!
//! `Host` and `Connection: close` are always sent; the response is read to
//! the close (a chunked body decoded) into a [`TestResponse`]: status,
//! headers and body as the client got them, with nothing pooled or retried
//! in between (unlike [`TestCluster::get`](super::TestCluster::get)'s
//! pooled client).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use super::TestResponse;

/// How long [`HttpRequest`] waits to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One HTTP/1.1 request on a fresh connection (see the module docs):
/// `Host` and `Connection: close` are always sent.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    method: String,
    host: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout: Duration,
}

impl HttpRequest {
    /// `GET path` with `Host: host`.
    pub fn get(host: &str, path: &str) -> HttpRequest {
        HttpRequest::new("GET", host, path)
    }

    /// `METHOD path` with `Host: host`.
    pub fn new(method: &str, host: &str, path: &str) -> HttpRequest {
        HttpRequest {
            method: method.into(),
            host: host.into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: Duration::from_secs(30),
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> HttpRequest {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sends `body`, with its `Content-Length`.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> HttpRequest {
        self.body = body.into();
        self
    }

    /// Gives up reading the answer after `timeout` (30 s unless set).
    pub fn timeout(mut self, timeout: Duration) -> HttpRequest {
        self.timeout = timeout;
        self
    }

    /// The request's bytes.
    fn bytes(&self) -> Vec<u8> {
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.method, self.path, self.host
        );
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !self.body.is_empty() || self.method != "GET" {
            head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }

    /// Sends it to `addr` and reads the answer to the close.
    pub fn send(&self, addr: SocketAddr) -> std::io::Result<TestResponse> {
        let mut s = std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.write_all(&self.bytes())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        parse_response(&buf)
    }

    /// [`HttpRequest::send`] for async code.
    pub async fn send_async(&self, addr: SocketAddr) -> std::io::Result<TestResponse> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let timed_out = |what: &str| std::io::Error::new(std::io::ErrorKind::TimedOut, what);
        let mut s = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| timed_out("connect"))??;
        s.write_all(&self.bytes()).await?;
        let mut buf = Vec::new();
        tokio::time::timeout(self.timeout, s.read_to_end(&mut buf))
            .await
            .map_err(|_| timed_out("no answer in time"))??;
        parse_response(&buf)
    }
}

fn invalid(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
}

/// An HTTP/1.x response read to the close: status line, headers, and the
/// body (de-chunked if it came chunked).
fn parse_response(raw: &[u8]) -> std::io::Result<TestResponse> {
    let shown = || String::from_utf8_lossy(&raw[..raw.len().min(200)]).into_owned();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid(format!("no response head in {:?}", shown())))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| invalid(format!("no status line in {:?}", shown())))?;
    let mut headers = http::HeaderMap::new();
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(k.trim().as_bytes()),
            http::HeaderValue::from_str(v.trim()),
        ) {
            headers.append(k, v);
        }
    }
    let body = &raw[end + 4..];
    let chunked = headers
        .get(http::header::TRANSFER_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok(TestResponse {
        status,
        headers,
        body: body.into(),
    })
}

/// A chunked body's data (trailers dropped).
fn dechunk(mut raw: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| invalid("a chunk size line without its end"))?;
        let size = String::from_utf8_lossy(&raw[..line_end]);
        let size = size.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| invalid(format!("bad chunk size {size:?}")))?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let data = raw
            .get(..size)
            .ok_or_else(|| invalid("a chunk cut short"))?;
        out.extend_from_slice(data);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_parsed_and_a_chunked_body_decoded() {
        let r = parse_response(
            b"HTTP/1.1 201 Created\r\nX-A: 1\r\nx-a: 2\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: t\r\n\r\n",
        )
        .expect("parses");
        assert_eq!(r.status, 201);
        assert_eq!(r.header("x-a"), "1");
        assert_eq!(r.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(r.text(), "hello, world");
        let r = parse_response(b"HTTP/1.0 404 Not Found\r\ncontent-length: 3\r\n\r\nnah")
            .expect("parses");
        assert_eq!((r.status, r.text().as_str()), (404, "nah"));
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\n").is_err(),
            "no end of head"
        );
        assert!(parse_response(b"garbage\r\n\r\n").is_err(), "no status");
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n").is_err()
        );
    }

    #[test]
    fn a_request_says_its_host_closes_and_declares_its_body() {
        let get = String::from_utf8(HttpRequest::get("a.localhost", "/x?y").bytes()).expect("utf8");
        assert_eq!(
            get,
            "GET /x?y HTTP/1.1\r\nHost: a.localhost\r\nConnection: close\r\n\r\n"
        );
        let post = HttpRequest::new("POST", "b", "/")
            .header("x-t", "1")
            .body("ping")
            .bytes();
        assert_eq!(
            String::from_utf8(post).expect("utf8"),
            "POST / HTTP/1.1\r\nHost: b\r\nConnection: close\r\nx-t: 1\r\nContent-Length: 4\r\n\r\nping"
        );
    }
}
