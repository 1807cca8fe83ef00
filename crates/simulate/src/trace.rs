//! Request traces: which Worker was invoked when, read from a file.
//!
//! # Model
//!
//! A trace is a list of Workers (script IDs) and a time-ordered list of
//! invocations, each a virtual time in milliseconds and an index into the
//! Worker list ([`Trace`]). Nothing else is taken from the file: which server
//! receives a request, how long it runs and how big the Worker is are the
//! consumer's business (the data-center simulator draws them from its models;
//! `hearth bench` replays the timing against real nodes). Two formats are
//! read:
//!
//! * **CSV** ([`TraceFormat::Csv`]): one invocation per line,
//!   `timestamp,script_id`, the timestamp in seconds (a float; any origin,
//!   e.g. 0 or Unix time). An optional header is recognised on the first
//!   line when its first field is not a number. Blank lines and lines whose
//!   first non-blank character is `#` are skipped. Fields are trimmed; CSV
//!   quoting is not supported (script IDs are DNS labels, never commas).
//!   Lines need not be in time order.
//! * **Azure Functions 2019** ([`TraceFormat::Azure`]): the per-minute
//!   invocation counts of the public "Serverless in the Wild" trace, with a
//!   header such as `HashFunction,HashOwner,HashApp,1_minute,…,1440_minute`
//!   (the original files' `HashOwner,HashApp,HashFunction,Trigger,1,…,1440`
//!   also works). Each row is one function; its script ID is the
//!   `HashFunction` column, and rows sharing an ID are one Worker. Column
//!   `N_minute` (or `N`) holds the number of invocations that started in
//!   minute `N` (1-based), i.e. in `[(N-1)·60 s, N·60 s)`. Each of those
//!   invocations is placed at an independent uniformly random millisecond of
//!   its minute — a Poisson process conditioned on the per-minute count —
//!   drawn from a generator seeded by the caller, so a given file and seed
//!   always give the same trace. Other columns (`HashOwner`, `HashApp`,
//!   `Trigger`) are ignored; an empty count cell counts as 0.
//!
//! [`TraceFormat::Auto`] picks Azure when the first line names a
//! `HashFunction` column, CSV otherwise.
//!
//! Traces are input: a malformed line is an error naming its 1-based line
//! number ([`TraceError::Malformed`]), never a panic and never silently
//! skipped, and the total number of invocations is capped at [`MAX_EVENTS`]
//! so a corrupt count cannot exhaust memory.
//!
//! # Example
//!
//! ```
//! use hearth_simulate::trace::{parse, TraceFormat};
//!
//! let text = "timestamp,script_id\n0.5,shop\n0.25,blog\n1,shop\n";
//! let trace = parse(text.as_bytes(), TraceFormat::Auto, 0).unwrap();
//! assert_eq!(trace.workers, ["shop", "blog"]);
//! let times: Vec<u64> = trace.events.iter().map(|e| e.t_ms).collect();
//! assert_eq!(times, [250, 500, 1000]);
//! assert_eq!(trace.events[0].worker, 1); // "blog"
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Most invocations a trace may hold (2^27, about 2 GiB of events): larger
/// traces are refused with [`TraceError::TooLarge`] instead of exhausting
/// memory.
pub const MAX_EVENTS: u64 = 1 << 27;

/// Milliseconds in one minute column of the Azure format.
const MINUTE_MS: u64 = 60_000;

/// Largest CSV timestamp accepted, in seconds (about 31,700 years): keeps the
/// conversion to integer milliseconds exact and far from overflow.
const MAX_TIMESTAMP_S: f64 = 1e12;

/// Which trace format a file is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum TraceFormat {
    /// Decide from the first line: Azure if it names a `HashFunction`
    /// column, CSV otherwise.
    #[default]
    Auto,
    /// `timestamp,script_id` lines, timestamp in seconds.
    Csv,
    /// Azure Functions 2019 per-minute invocation counts.
    Azure,
}

/// One invocation: when, and which Worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceEvent {
    /// Virtual time in milliseconds (CSV: the file's timestamp × 1000,
    /// rounded; Azure: since the start of minute 1).
    pub t_ms: u64,
    /// Index into [`Trace::workers`].
    pub worker: u32,
}

/// A parsed trace: the Workers and their invocations in time order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Script IDs, in order of first appearance in the file.
    pub workers: Vec<String>,
    /// Invocations sorted by time (ties by Worker index).
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// Number of invocations.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the trace has no invocation.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Time from the first invocation to the last, in milliseconds (0 for
    /// fewer than two).
    pub fn span_ms(&self) -> u64 {
        match (self.events.first(), self.events.last()) {
            (Some(a), Some(b)) => b.t_ms - a.t_ms,
            _ => 0,
        }
    }

    /// Invocations per Worker, indexed like [`Trace::workers`].
    pub fn counts(&self) -> Vec<u64> {
        let mut counts = vec![0u64; self.workers.len()];
        for e in &self.events {
            if let Some(c) = counts.get_mut(e.worker as usize) {
                *c += 1;
            }
        }
        counts
    }
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("reading trace {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong (in the message, so not also a `source`, which
        /// would print it twice in an error chain).
        error: io::Error,
    },
    /// Reading from a stream failed (for [`parse`] on a reader).
    #[error("reading trace: {0}")]
    Read(#[from] io::Error),
    /// A line could not be understood.
    #[error("trace line {line}: {message}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The trace holds more than [`MAX_EVENTS`] invocations.
    #[error("trace has more than {max} invocations (line {line})")]
    TooLarge {
        /// The line at which the limit was passed.
        line: usize,
        /// The limit, [`MAX_EVENTS`].
        max: u64,
    },
    /// The trace names more Workers than fit a `u32` index.
    #[error("trace names more than {} Workers", u32::MAX)]
    TooManyWorkers,
}

fn malformed(line: usize, message: impl Into<String>) -> TraceError {
    TraceError::Malformed {
        line,
        message: message.into(),
    }
}

/// Reads the trace in `path`. `seed` places Azure invocations within their
/// minute (ignored for CSV).
pub fn load(path: &Path, format: TraceFormat, seed: u64) -> Result<Trace, TraceError> {
    let io_err = |error| TraceError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = File::open(path).map_err(io_err)?;
    parse(BufReader::new(file), format, seed).map_err(|e| match e {
        TraceError::Read(source) => io_err(source),
        other => other,
    })
}

/// Parses a trace from `reader` in `format` (see the [module docs](self)).
pub fn parse(
    mut reader: impl BufRead,
    format: TraceFormat,
    seed: u64,
) -> Result<Trace, TraceError> {
    match format {
        TraceFormat::Csv => parse_csv(reader),
        TraceFormat::Azure => parse_azure(reader, seed),
        TraceFormat::Auto => {
            // Peek at the first line, then put it back in front.
            let mut first = String::new();
            reader.read_line(&mut first)?;
            let detected = detect(&first);
            let reader = io::Cursor::new(first).chain(reader);
            match detected {
                TraceFormat::Azure => parse_azure(reader, seed),
                _ => parse_csv(reader),
            }
        }
    }
}

/// The format a file whose first line is `first_line` is in:
/// [`TraceFormat::Azure`] if it names a `HashFunction` column, else
/// [`TraceFormat::Csv`].
pub fn detect(first_line: &str) -> TraceFormat {
    if first_line
        .split(',')
        .any(|f| f.trim().eq_ignore_ascii_case("HashFunction"))
    {
        TraceFormat::Azure
    } else {
        TraceFormat::Csv
    }
}

/// Maps script IDs to dense indices in order of first appearance.
#[derive(Default)]
struct Interner {
    ids: Vec<String>,
    index: HashMap<String, u32>,
}

impl Interner {
    fn intern(&mut self, id: &str) -> Result<u32, TraceError> {
        if let Some(&i) = self.index.get(id) {
            return Ok(i);
        }
        let i = u32::try_from(self.ids.len()).map_err(|_| TraceError::TooManyWorkers)?;
        self.ids.push(id.to_string());
        self.index.insert(id.to_string(), i);
        Ok(i)
    }
}

/// The lines of `reader` with their 1-based numbers; a line that is not
/// UTF-8 is a [`TraceError::Malformed`] naming it.
fn numbered_lines(
    reader: impl BufRead,
) -> impl Iterator<Item = Result<(usize, String), TraceError>> {
    reader.split(b'\n').enumerate().map(|(i, line)| {
        let n = i + 1;
        let mut bytes = line?;
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        String::from_utf8(bytes)
            .map(|text| (n, text))
            .map_err(|_| malformed(n, "not valid UTF-8"))
    })
}

/// Parses the CSV format: `timestamp,script_id` per line (see the
/// [module docs](self)).
pub fn parse_csv(reader: impl BufRead) -> Result<Trace, TraceError> {
    let mut workers = Interner::default();
    let mut events = Vec::new();
    let mut seen_content = false;
    for line in numbered_lines(reader) {
        let (n, line) = line?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let first_content = !seen_content;
        seen_content = true;
        let mut fields = line.split(',').map(str::trim);
        let (Some(ts), Some(id), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(malformed(
                n,
                format!("expected `timestamp,script_id`, got {line:?}"),
            ));
        };
        let t: f64 = match ts.parse() {
            Ok(t) => t,
            // A first line that does not start with a number is the header.
            Err(_) if first_content => continue,
            Err(_) => return Err(malformed(n, format!("timestamp {ts:?} is not a number"))),
        };
        if !t.is_finite() || !(0.0..=MAX_TIMESTAMP_S).contains(&t) {
            return Err(malformed(
                n,
                format!("timestamp {ts:?} must be a number of seconds in 0..={MAX_TIMESTAMP_S}"),
            ));
        }
        if id.is_empty() {
            return Err(malformed(n, "empty script ID"));
        }
        if events.len() as u64 >= MAX_EVENTS {
            return Err(TraceError::TooLarge {
                line: n,
                max: MAX_EVENTS,
            });
        }
        let worker = workers.intern(id)?;
        // Exact: t ≤ 1e12 so t × 1000 ≤ 1e15 < 2^53.
        let t_ms = (t * 1000.0).round() as u64;
        events.push(TraceEvent { t_ms, worker });
    }
    events.sort_unstable();
    Ok(Trace {
        workers: workers.ids,
        events,
    })
}

/// Parses the Azure Functions 2019 per-minute format (see the
/// [module docs](self)); `seed` places each invocation within its minute.
pub fn parse_azure(reader: impl BufRead, seed: u64) -> Result<Trace, TraceError> {
    let mut lines = numbered_lines(reader);
    let header = loop {
        match lines.next() {
            None => return Err(malformed(1, "empty file: expected an Azure header line")),
            Some(line) => {
                let (n, line) = line?;
                if !line.trim().is_empty() {
                    break (n, line);
                }
            }
        }
    };
    let (header_line, header) = header;
    // Column roles: the ID column and, for each minute column, its minute.
    let mut id_col = None;
    let mut minute_of: Vec<Option<u64>> = Vec::new();
    for (c, name) in header.split(',').map(str::trim).enumerate() {
        if name.eq_ignore_ascii_case("HashFunction") {
            id_col = Some(c);
        }
        let number = name.strip_suffix("_minute").unwrap_or(name);
        minute_of.push(match number.parse::<u64>() {
            Ok(m) if m >= 1 => Some(m),
            Ok(_) => {
                return Err(malformed(
                    header_line,
                    format!("minute column {name:?}: minutes are numbered from 1"),
                ));
            }
            Err(_) => None,
        });
    }
    let Some(id_col) = id_col else {
        return Err(malformed(
            header_line,
            "Azure header has no HashFunction column",
        ));
    };
    if minute_of.iter().all(Option::is_none) {
        return Err(malformed(
            header_line,
            "Azure header has no minute columns (`1_minute`, … or `1`, …)",
        ));
    }

    let mut rng = StdRng::seed_from_u64(seed ^ 0x617a_7572_6532_3031); // "azure201"
    let mut workers = Interner::default();
    let mut events: Vec<TraceEvent> = Vec::new();
    for line in lines {
        let (n, line) = line?;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != minute_of.len() {
            return Err(malformed(
                n,
                format!(
                    "expected {} columns like the header, got {}",
                    minute_of.len(),
                    fields.len()
                ),
            ));
        }
        let id = fields[id_col];
        if id.is_empty() {
            return Err(malformed(n, "empty HashFunction"));
        }
        let worker = workers.intern(id)?;
        for (field, minute) in fields.iter().zip(&minute_of) {
            let Some(minute) = *minute else { continue };
            let count: u64 = if field.is_empty() {
                0
            } else {
                field.parse().map_err(|_| {
                    malformed(
                        n,
                        format!("minute {minute}: count {field:?} is not a non-negative integer"),
                    )
                })?
            };
            if count > MAX_EVENTS - events.len() as u64 {
                return Err(TraceError::TooLarge {
                    line: n,
                    max: MAX_EVENTS,
                });
            }
            let start = (minute - 1).saturating_mul(MINUTE_MS);
            for _ in 0..count {
                let t_ms = start.saturating_add(rng.random_range(0..MINUTE_MS));
                events.push(TraceEvent { t_ms, worker });
            }
        }
    }
    events.sort_unstable();
    Ok(Trace {
        workers: workers.ids,
        events,
    })
}
