//! Tail Workers: what hearth sends them, read back.
//!
//! A Worker deployed as a tail Worker of another receives, once per flow
//! that Worker started and after the flow has ended, `POST /` with a JSON
//! body: the flow's entry Worker and every trace event of every level on
//! every node (`log` lines from stdout/stderr, `subrequest`, `exception`,
//! `outcome`). [`parse`] turns that body into a [`TailBatch`]:
//!
//! ```no_run
//! use hearth_sdk::fetch::{Request, Response};
//! use hearth_sdk::{Env, Worker};
//!
//! struct Traces;
//!
//! impl Worker for Traces {
//!     async fn fetch(req: Request, _env: Env) -> Response {
//!         match hearth_sdk::tail::parse(&req.body) {
//!             Ok(batch) => {
//!                 for e in &batch.events {
//!                     hearth_sdk::log!("{} on {}: {} {}", e.script_id, e.node, e.kind, e.message);
//!                 }
//!                 Response::new(204, "")
//!             }
//!             Err(e) => Response::new(400, e),
//!         }
//!     }
//! }
//! hearth_sdk::export_fetch!(Traces);
//! ```

/// One trace event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TailEvent {
    /// The Worker that produced it.
    pub script_id: String,
    /// The node it ran on.
    pub node: String,
    /// When, in milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// `log`, `subrequest`, `exception` or `outcome`.
    pub kind: String,
    /// Its text.
    pub message: String,
}

/// A whole flow, as delivered to a tail Worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TailBatch {
    /// The flow's entry Worker.
    pub entry: String,
    /// Every event of the flow.
    pub events: Vec<TailEvent>,
}

/// Reads a tail Worker's request body.
pub fn parse(body: &[u8]) -> Result<TailBatch, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err("trailing characters after the JSON value".into());
    }
    let Json::Object(top) = v else {
        return Err("expected a JSON object".into());
    };
    let mut batch = TailBatch::default();
    for (k, v) in top {
        match (k.as_str(), v) {
            ("entry", Json::String(s)) => batch.entry = s,
            ("events", Json::Array(list)) => {
                for e in list {
                    let Json::Object(fields) = e else {
                        return Err("an event is not an object".into());
                    };
                    let mut ev = TailEvent::default();
                    for (k, v) in fields {
                        match (k.as_str(), v) {
                            ("script_id", Json::String(s)) => ev.script_id = s,
                            ("node", Json::String(s)) => ev.node = s,
                            ("kind", Json::String(s)) => ev.kind = s,
                            ("message", Json::String(s)) => ev.message = s,
                            ("timestamp_unix_ms", Json::Number(n)) => {
                                ev.timestamp_unix_ms = n as u64
                            }
                            _ => {}
                        }
                    }
                    batch.events.push(ev);
                }
            }
            _ => {}
        }
    }
    Ok(batch)
}

/// The JSON values [`parse`] needs.
enum Json {
    Null,
    Bool,
    Number(f64),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

/// Deepest nesting accepted.
const MAX_DEPTH: usize = 64;

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Result<(), String> {
        self.ws();
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", b as char, self.i))
        }
    }

    fn literal(&mut self, word: &str, v: Json) -> Result<Json, String> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(format!("unexpected token at byte {}", self.i))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, String> {
        if depth > MAX_DEPTH {
            return Err("JSON nested too deeply".into());
        }
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Object(fields));
                }
                loop {
                    self.ws();
                    let k = self.string()?;
                    self.eat(b':')?;
                    fields.push((k, self.value(depth + 1)?));
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Object(fields));
                        }
                        _ => return Err(format!("expected ',' or '}}' at byte {}", self.i)),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Array(items));
                        }
                        _ => return Err(format!("expected ',' or ']' at byte {}", self.i)),
                    }
                }
            }
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b't') => self.literal("true", Json::Bool),
            Some(b'f') => self.literal("false", Json::Bool),
            Some(b'n') => self.literal("null", Json::Null),
            Some(_) => {
                let start = self.i;
                while self.i < self.s.len()
                    && matches!(
                        self.s[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                std::str::from_utf8(&self.s[start..self.i])
                    .ok()
                    .and_then(|t| t.parse::<f64>().ok())
                    .map(Json::Number)
                    .ok_or_else(|| format!("invalid value at byte {start}"))
            }
            None => Err("unexpected end of JSON".into()),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.eat(b'"')?;
        let mut out = String::new();
        loop {
            let Some(&b) = self.s.get(self.i) else {
                return Err("unterminated string".into());
            };
            self.i += 1;
            match b {
                b'"' => return Ok(out),
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else {
                        return Err("unterminated escape".into());
                    };
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let mut code = self.hex4()?;
                            if (0xD800..0xDC00).contains(&code)
                                && self.s[self.i..].starts_with(b"\\u")
                            {
                                self.i += 2;
                                let low = self.hex4()?;
                                code = 0x10000
                                    + ((code - 0xD800) << 10)
                                    + (low.wrapping_sub(0xDC00) & 0x3FF);
                            }
                            out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                        }
                        _ => return Err(format!("invalid escape at byte {}", self.i)),
                    }
                }
                _ => {
                    // Copy a run of plain bytes (valid UTF-8: the input is a str).
                    let start = self.i - 1;
                    while self.i < self.s.len() && !matches!(self.s[self.i], b'"' | b'\\') {
                        self.i += 1;
                    }
                    out.push_str(&String::from_utf8_lossy(&self.s[start..self.i]));
                }
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or_else(|| format!("invalid \\u escape at byte {}", self.i))?;
        self.i += 4;
        Ok(digits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_hearth_sends() {
        let body = br#"{"entry":"dispatcher","events":[{"script_id":"user-a","node":"node-2","timestamp_unix_ms":1700000000123,"kind":"log","message":"a \"quoted\" line\n\u00e9"}]}"#;
        let b = parse(body).expect("parses");
        assert_eq!(b.entry, "dispatcher");
        assert_eq!(b.events.len(), 1);
        assert_eq!(b.events[0].timestamp_unix_ms, 1_700_000_000_123);
        assert_eq!(b.events[0].message, "a \"quoted\" line\né");
        assert!(parse(b"{\"entry\": ").is_err());
        assert!(parse(b"[[[[").is_err());
    }
}
