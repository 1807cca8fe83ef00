//! The documentation's console examples, run against the built `hearth`,
//! and its links, checked: a guide cannot drift from the binary, nor point
//! at a file that moved.
//!
//! ## Console examples
//!
//! Every block fenced as `console` in `README.md` and `docs/**/*.md` is a
//! transcript; other blocks (`sh`, `toml`, `js`, ...) are not run.
//!
//! - A line starting with `$ ` is a command; a line ending with `\`
//!   continues it on the next (the text goes to bash as written, so quoting
//!   works across the break). A command ending with ` &` runs in the
//!   background for the rest of its document.
//! - The lines after a command, up to the next `$ ` line or the end of the
//!   block, are what it must print (stdout and stderr together). `...` alone
//!   on a line stands for any number of lines (none included); `[..]` within
//!   a line for any text on that line. Trailing spaces and trailing blank
//!   lines do not count. A command with no expected lines must only exit 0.
//! - A command must exit 0, unless its expected output ends with
//!   `[exit: N]`: then it must exit N.
//! - A background command must say that it is up: a line containing one of
//!   [`READY_WORDS`] (any case) within [`BACKGROUND_PATIENCE_S`] seconds.
//!   Its expected lines are matched against what it printed up to and
//!   including that line. (`hearth serve` and `hearth dev` say `serving`,
//!   `hearth cluster` ends its banner with `deploy with: ...`.)
//!
//! ## How a document runs
//!
//! One document is one bash script, run with `set -o pipefail` in a fresh
//! scratch directory, so its commands share the directory, the variables
//! they set and the processes they start, in order. Each command is
//! sourced from a file of its own (a quoting slip in one cannot swallow
//! the next), between marker lines the runner splits the output on. The
//! built `hearth` is first on `PATH`, and `HEARTH_REPO` is the repository's
//! root, for examples that name its files (the sample Workers are in
//! `$HEARTH_REPO/sample-workers/workers/target/hearth-samples/`, which
//! `hearth samples` prints). A background command gets a process group of
//! its own, killed with everything in it when its document ends; bash
//! waits for them to be gone, so the next document finds their ports free.
//! Documents run one at a time, in one test. Examples listen on fixed
//! `127.0.0.1` ports from 8000 to 9999 (other tests draw random ports
//! above 10000). A document stops at its first failing command; the test
//! reports every failing document: the file, the line of the command, and
//! a diff of what it should have printed against what it did.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a background command prints once it is up (compared ignoring case).
const READY_WORDS: &[&str] = &["listening", "ready", "serving", "deploy with"];

/// How long a background command has to say it is up.
const BACKGROUND_PATIENCE_S: u32 = 60;

/// How long one command may run before its document is stopped.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// The repository's root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The documents: README.md, then every Markdown file under docs/, sorted.
fn documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    let mut docs = vec![repo().join("README.md")];
    walk(&repo().join("docs"), &mut docs);
    docs
}

/// A path as the failure messages show it: relative to the repository.
fn shown(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// One command of a console block and what it must do.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Example {
    /// The 1-based line of its `$ ` in the document.
    line: usize,
    /// The command, its continuation lines joined with newlines.
    command: String,
    /// Whether it ended with ` &` (removed from `command`).
    background: bool,
    /// The lines it must print (patterns), without `[exit: N]`.
    expected: Vec<String>,
    /// The exit status it must end with.
    exit: i32,
}

/// A fenced block's opening line: its indentation and info string.
fn fence(line: &str) -> Option<(usize, &str)> {
    let body = line.trim_start();
    let indent = line.len() - body.len();
    body.strip_prefix("```").map(|info| (indent, info.trim()))
}

/// The console examples of a Markdown document, in order.
fn parse(text: &str) -> Result<Vec<Example>, String> {
    let mut examples: Vec<Example> = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((_, line)) = lines.next() {
        let Some((indent, info)) = fence(line) else {
            continue;
        };
        let console = info == "console";
        // The index in `examples` of the block's first command.
        let first = examples.len();
        let mut continues = false;
        let mut closed = false;
        for (i, line) in lines.by_ref() {
            if fence(line).is_some_and(|(_, info)| info.is_empty()) {
                closed = true;
                break;
            }
            if !console {
                continue;
            }
            // The block's own indentation is not part of the transcript.
            let skip = line.len() - line.trim_start().len();
            let line = &line[skip.min(indent)..];
            if continues {
                let last = examples.last_mut().expect("a command continues");
                last.command.push('\n');
                last.command.push_str(line);
                continues = line.ends_with('\\');
            } else if let Some(command) = line.strip_prefix("$ ") {
                examples.push(Example {
                    line: i + 1,
                    command: command.to_string(),
                    background: false,
                    expected: Vec::new(),
                    exit: 0,
                });
                continues = command.ends_with('\\');
            } else if examples.len() > first {
                let last = examples.last_mut().expect("a command");
                last.expected.push(line.trim_end().to_string());
            } else {
                return Err(format!(
                    "line {}: a console block's first line must be a command (`$ ...`)",
                    i + 1
                ));
            }
        }
        if !closed {
            return Err("a fenced block is not closed".to_string());
        }
    }
    for example in &mut examples {
        if let Some(command) = example.command.trim_end().strip_suffix(" &") {
            example.command = command.to_string();
            example.background = true;
        }
        while example.expected.last().is_some_and(|l| l.is_empty()) {
            example.expected.pop();
        }
        if let Some(code) = example
            .expected
            .last()
            .and_then(|l| l.strip_prefix("[exit: "))
            .and_then(|l| l.strip_suffix(']'))
        {
            example.exit = code
                .parse()
                .map_err(|_| format!("line {}: [exit: {code}] is not a number", example.line))?;
            example.expected.pop();
        }
    }
    Ok(examples)
}

/// Whether `actual` matches the one-line pattern `pattern` (`[..]` is any
/// text).
fn line_matches(pattern: &str, actual: &str) -> bool {
    let pattern = pattern.trim_end();
    let actual = actual.trim_end();
    let mut parts = pattern.split("[..]");
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = actual.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Whether the lines `actual` match the patterns `expected` (`...` is any
/// number of lines).
fn lines_match(expected: &[String], actual: &[String]) -> bool {
    // matches[i][j]: expected[i..] matches actual[j..].
    let (n, m) = (expected.len(), actual.len());
    let mut matches = vec![vec![false; m + 1]; n + 1];
    matches[n][m] = true;
    for i in (0..n).rev() {
        for j in (0..=m).rev() {
            matches[i][j] = if expected[i] == "..." {
                matches[i + 1][j] || (j < m && matches[i][j + 1])
            } else {
                j < m && line_matches(&expected[i], &actual[j]) && matches[i + 1][j + 1]
            };
        }
    }
    matches[0][0]
}

/// A line diff of the patterns `expected` against `actual`: `  ` a line
/// that matches, `- ` one expected and missing, `+ ` one printed and not
/// expected (a longest common subsequence under the pattern rules; `...`
/// is shown where it stands).
fn diff(expected: &[String], actual: &[String]) -> String {
    let (n, m) = (expected.len(), actual.len());
    let same = |i: usize, j: usize| expected[i] == "..." || line_matches(&expected[i], &actual[j]);
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if same(i, j) {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut out = String::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && expected[i] == "..." {
            // `...` takes actual lines as long as the rest can still match.
            if j < m && lcs[i][j + 1] >= lcs[i + 1][j] {
                out.push_str(&format!("  {}\n", actual[j]));
                j += 1;
            } else {
                out.push_str("  ...\n");
                i += 1;
            }
        } else if i < n && j < m && same(i, j) {
            out.push_str(&format!("  {}\n", actual[j]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push_str(&format!("- {}\n", expected[i]));
            i += 1;
        } else {
            out.push_str(&format!("+ {}\n", actual[j]));
            j += 1;
        }
    }
    out
}

/// What one command printed and how it ended.
struct Ran {
    output: Vec<String>,
    exit: i32,
}

/// Why an example failed, as the test reports it.
fn mismatch(path: &Path, example: &Example, ran: &Ran) -> Option<String> {
    let printed = lines_match(&example.expected, &ran.output);
    let exited = ran.exit == example.exit;
    if printed && exited {
        return None;
    }
    let mut why = format!(
        "{}:{}: `{}`",
        shown(path),
        example.line,
        example.command.replace('\n', " ")
    );
    if !exited {
        why.push_str(&format!(" exited {} (expected {})", ran.exit, example.exit));
    }
    if printed {
        why.push_str("; it printed:\n");
        for line in &ran.output {
            why.push_str(&format!("  {line}\n"));
        }
    } else {
        why.push_str(&format!(
            " printed something else (- expected, + printed):\n{}",
            diff(&example.expected, &ran.output)
        ));
    }
    Some(why)
}

/// The bash script of one document: each command sourced from
/// `<dir>/cmd-<i>.sh` between marker lines (`<marker> begin i`, `<marker>
/// end i status`; `<marker> bg pid` for a background command's group).
fn script(examples: &[Example], dir: &Path, marker: &str) -> std::io::Result<String> {
    let words = READY_WORDS.join("|");
    let mut s = format!(
        r#"exec 2>&1
set -o pipefail
M='{marker}'
R='{dir}'
__doc_bg=()
# Prints the background command's log up to its first line that says it is
# up (and returns 0), or all of it and why not (and returns 1).
__doc_ready() {{
  local log=$1 pid=$2 i=0
  while [ "$i" -lt {ticks} ]; do
    if awk 'tolower($0) ~ /{words}/ {{ found = 1; exit }} END {{ exit !found }}' "$log"; then
      awk '{{ print }} tolower($0) ~ /{words}/ {{ exit }}' "$log"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$log"
      echo "[the background command ended before it said it was up]"
      return 1
    fi
    sleep 0.1
    i=$((i + 1))
  done
  cat "$log"
  echo "[no line with {words} after {patience} s]"
  return 1
}}
"#,
        dir = dir.display(),
        ticks = BACKGROUND_PATIENCE_S * 10,
        patience = BACKGROUND_PATIENCE_S,
    );
    for (i, example) in examples.iter().enumerate() {
        std::fs::write(
            dir.join(format!("cmd-{i}.sh")),
            format!("{}\n", example.command),
        )?;
        s.push_str(&format!("printf '%s begin {i}\\n' \"$M\"\n"));
        if example.background {
            // Job control only while it starts: the job gets a process
            // group of its own (killed below), the foreground commands stay
            // in the script's (killed by the runner on a timeout).
            s.push_str(&format!(
                "set -m\n{{ . \"$R/cmd-{i}.sh\"; }} > \"$R/bg-{i}.log\" 2>&1 &\n__doc_pid=$!\nset +m\n\
                 __doc_bg+=(\"$__doc_pid\")\nprintf '%s bg %d\\n' \"$M\" \"$__doc_pid\"\n\
                 __doc_ready \"$R/bg-{i}.log\" \"$__doc_pid\"\n"
            ));
        } else {
            s.push_str(&format!(". \"$R/cmd-{i}.sh\"\n"));
        }
        s.push_str(&format!("printf '\\n%s end {i} %d\\n' \"$M\" \"$?\"\n"));
    }
    // The background groups die, and bash waits for them (their ports
    // are free once it has); anything else a command left running is in
    // the script's group, which the runner kills.
    s.push_str(
        "for __p in \"${__doc_bg[@]}\"; do kill -KILL -- \"-$__p\" 2>/dev/null; done\n\
         if [ ${#__doc_bg[@]} -gt 0 ]; then wait \"${__doc_bg[@]}\" 2>/dev/null; fi\n\
         printf '%s done\\n' \"$M\"\n",
    );
    Ok(s)
}

/// Kills a process group, ignoring one that is gone.
fn kill_group(pgid: i32) {
    // SAFETY: kill(2) with a negative pid signals that process group; it
    // touches no memory of ours.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

/// Runs one document's examples; the failure of the first that fails.
fn run_document(path: &Path, examples: &[Example]) -> Result<(), String> {
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let runner = tempfile::tempdir().expect("a directory for the script");
    let marker = format!("@@hearth-docs-{}@@", std::process::id());
    let text = script(examples, runner.path(), &marker).expect("writing the script");
    let script_path = runner.path().join("document.sh");
    std::fs::write(&script_path, text).expect("writing the script");

    let bin = Path::new(env!("CARGO_BIN_EXE_hearth"))
        .parent()
        .expect("the binary's directory");
    let path_var = match std::env::var_os("PATH") {
        Some(p) => {
            let mut dirs = vec![bin.to_path_buf()];
            dirs.extend(std::env::split_paths(&p));
            std::env::join_paths(dirs).expect("a PATH")
        }
        None => bin.as_os_str().to_owned(),
    };
    let mut bash = Command::new("bash");
    bash.arg(&script_path)
        .current_dir(scratch.path())
        .env("PATH", path_var)
        .env("HEARTH_REPO", repo())
        .env_remove("HEARTH_ADMIN_TOKEN")
        .env_remove("HEARTH_ADMIN_CA")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    // `hearth build` takes the samples' JS toolchain instead of installing
    // its own into the user's cache (what a first build does).
    if let Some(modules) = hearth::testing::js_toolchain() {
        bash.env("HEARTH_JS_NODE_MODULES", modules);
    }
    std::os::unix::process::CommandExt::process_group(&mut bash, 0);
    let mut child = bash.spawn().expect("bash runs");
    let pgid = i32::try_from(child.id()).expect("a pid");
    let stdout = child.stdout.take().expect("bash's stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.strip_suffix('\n').unwrap_or(&line);
                    if tx.send(line.to_string()).is_err() {
                        break;
                    }
                }
            }
        }
    });

    let mut groups: Vec<i32> = Vec::new();
    let result = read_transcript(path, examples, &rx, &marker, &mut groups);
    if result.is_ok() {
        // The script's end: it kills its background groups and waits for
        // them, so their ports are free for the next document.
        let done = format!("{marker} done");
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if line == done {
                break;
            }
        }
    }
    // Whatever happened, nothing of this document outlives it: the script
    // and what its commands left running, then every background group,
    // including any it started after the runner stopped reading.
    kill_group(pgid);
    let bg = format!("{marker} bg ");
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if let Some(pid) = line.strip_prefix(&bg).and_then(|p| p.parse().ok()) {
            groups.push(pid);
        }
    }
    for g in &groups {
        kill_group(*g);
    }
    let _ = child.wait();
    result
}

/// Reads the script's output, command by command, and checks each.
fn read_transcript(
    path: &Path,
    examples: &[Example],
    rx: &mpsc::Receiver<String>,
    marker: &str,
    groups: &mut Vec<i32>,
) -> Result<(), String> {
    let begin = format!("{marker} begin ");
    let end = format!("{marker} end ");
    let bg = format!("{marker} bg ");
    for (i, example) in examples.iter().enumerate() {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        let mut output: Vec<String> = Vec::new();
        let mut started = false;
        let exit = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "{}:{}: `{}` did not finish within {} s; it printed:\n  {}",
                        shown(path),
                        example.line,
                        example.command,
                        COMMAND_TIMEOUT.as_secs(),
                        output.join("\n  ")
                    ));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "{}:{}: the document's script ended during `{}`; it printed:\n  {}",
                        shown(path),
                        example.line,
                        example.command,
                        output.join("\n  ")
                    ));
                }
            };
            if let Some(n) = line.strip_prefix(&begin) {
                assert_eq!(n, i.to_string(), "the commands run in order");
                started = true;
            } else if let Some(pid) = line.strip_prefix(&bg) {
                groups.push(pid.parse().expect("a pid"));
            } else if let Some(rest) = line.strip_prefix(&end) {
                let status = rest
                    .strip_prefix(&format!("{i} "))
                    .and_then(|s| s.parse::<i32>().ok())
                    .expect("the end marker of this command");
                break status;
            } else if started {
                output.push(line);
            }
        };
        // The end marker starts with a newline of its own: the last line
        // is empty unless the output did not end with one.
        if output.last().is_some_and(|l| l.is_empty()) {
            output.pop();
        }
        while output.last().is_some_and(|l| l.trim_end().is_empty()) {
            output.pop();
        }
        let ran = Ran { output, exit };
        if let Some(why) = mismatch(path, example, &ran) {
            return Err(why);
        }
    }
    Ok(())
}

/// Every console example of the README and docs/ runs as shown.
#[test]
fn console_examples_run_as_shown() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for path in documents() {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let examples = match parse(&text) {
            Ok(e) => e,
            Err(e) => {
                failures.push(format!("{}: {e}", shown(&path)));
                continue;
            }
        };
        if examples.is_empty() {
            continue;
        }
        let started = Instant::now();
        let result = run_document(&path, &examples);
        eprintln!(
            "docs: {} ({} commands) in {:.1} s: {}",
            shown(&path),
            examples.len(),
            started.elapsed().as_secs_f64(),
            if result.is_ok() { "ok" } else { "FAILED" }
        );
        ran += examples.len();
        if let Err(e) = result {
            failures.push(e);
        }
    }
    assert!(ran > 0, "no console examples found");
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// The anchors a Markdown document's headings make, as GitHub makes them:
/// lower case, only letters, digits, `_`, `-` and spaces kept, spaces as
/// `-`; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut counts = std::collections::HashMap::new();
    let mut in_code = false;
    for line in text.lines() {
        if fence(line).is_some() {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let slug: String = line[hashes..]
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = counts.entry(slug.clone()).or_insert(0usize);
        seen.push(if *count == 0 {
            slug
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    seen
}

/// The link targets of a Markdown document (`[text](target)`, images too),
/// with their lines; code blocks and code spans (which may run over a line
/// break, not over a blank line) are not looked in.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    let mut in_span = false;
    for (i, line) in text.lines().enumerate() {
        if fence(line).is_some() {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if line.trim().is_empty() {
            in_span = false;
        }
        let prose: String = line
            .chars()
            .map(|c| {
                if c == '`' {
                    in_span = !in_span;
                    ' '
                } else if in_span {
                    ' '
                } else {
                    c
                }
            })
            .collect();
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(close) = after.find(')') else {
                break;
            };
            let target = after[..close].split_whitespace().next().unwrap_or("");
            out.push((i + 1, target.trim_matches(['<', '>']).to_string()));
            rest = &after[close..];
        }
    }
    out
}

/// Why a link target is not fine, if it is not: a relative one must name
/// a file (and a heading) in the repository; any other must be a public
/// web page.
fn bad_link(from: &Path, target: &str) -> Option<String> {
    if let Some(url) = target
        .strip_prefix("https://")
        .or_else(|| target.strip_prefix("http://"))
    {
        let host = url.split(['/', ':', '?', '#']).next().unwrap_or("");
        let local = host == "localhost"
            || host.ends_with(".localhost")
            || host.starts_with("127.")
            || host.starts_with("10.")
            || host.starts_with("192.168.")
            || host.is_empty();
        return local.then(|| format!("{target} is not a public page"));
    }
    if target.contains("://") || target.starts_with('/') || target.starts_with("file:") {
        return Some(format!("{target} points outside the repository"));
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let resolved = if file.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().expect("a document's directory").join(file)
    };
    let Ok(resolved) = resolved.canonicalize() else {
        return Some(format!("{target}: no such file"));
    };
    let root = repo().canonicalize().expect("the repository");
    if !resolved.starts_with(&root) {
        return Some(format!("{target} points outside the repository"));
    }
    if let Some(anchor) = anchor
        && resolved.extension().is_some_and(|x| x == "md")
    {
        let text = std::fs::read_to_string(&resolved).ok()?;
        if !anchors(&text).iter().any(|a| a == anchor) {
            return Some(format!("{target}: no heading makes #{anchor}"));
        }
    }
    None
}

/// Every link of the README and docs/ resolves: relative links to files
/// (and headings) in the repository, the rest to public pages.
#[test]
fn links_resolve() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for path in documents() {
        let text = std::fs::read_to_string(&path).expect("a document");
        for (line, target) in links(&text) {
            checked += 1;
            if let Some(why) = bad_link(&path, &target) {
                bad.push(format!("{}:{line}: {why}", shown(&path)));
            }
        }
    }
    assert!(checked > 0, "no links found");
    assert!(bad.is_empty(), "\n{}", bad.join("\n"));
}

/// The README's docs index names every page under docs/.
#[test]
fn the_readme_indexes_every_doc() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let linked: Vec<PathBuf> = links(&readme)
        .into_iter()
        .map(|(_, target)| repo().join(target.split('#').next().unwrap_or("")))
        .collect();
    let missing: Vec<String> = documents()
        .into_iter()
        .skip(1)
        .filter(|doc| !linked.contains(doc))
        .map(|doc| shown(&doc))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md's docs index does not link {missing:?}"
    );
}

fn lines(text: &[&str]) -> Vec<String> {
    text.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_line_pattern_matches_its_wildcards_and_nothing_more() {
    assert!(line_matches("hello", "hello"));
    assert!(line_matches("hello", "hello   "));
    assert!(!line_matches("hello", "hello!"));
    assert!(!line_matches("hello", "hell"));
    assert!(line_matches("took [..] ms", "took 1.25 ms"));
    assert!(line_matches("took [..] ms", "took  ms"));
    assert!(!line_matches("took [..] ms", "took 1.25 s"));
    assert!(line_matches("[..]", "anything at all"));
    assert!(line_matches("a[..]b[..]c", "a-b-b-c"));
    assert!(!line_matches("a[..]b[..]c", "a-c-b"));
    assert!(line_matches("[..]x[..]", "x"));
    assert!(!line_matches("[..]x[..]", "y"));
}

#[test]
fn an_ellipsis_line_matches_any_number_of_lines() {
    let expected = lines(&["first", "...", "last"]);
    assert!(lines_match(&expected, &lines(&["first", "last"])));
    assert!(lines_match(&expected, &lines(&["first", "a", "b", "last"])));
    assert!(!lines_match(&expected, &lines(&["first", "a", "b"])));
    assert!(!lines_match(&expected, &lines(&["a", "first", "last"])));
    assert!(lines_match(&lines(&["..."]), &[]));
    assert!(lines_match(&[], &[]));
    assert!(!lines_match(&[], &lines(&["unexpected"])));
    // Several ellipses, and a pattern line that also matches inside one.
    let expected = lines(&["...", "x [..]", "...", "end"]);
    assert!(lines_match(&expected, &lines(&["x 1", "x 2", "end"])));
    assert!(!lines_match(&expected, &lines(&["y 1", "end"])));
}

#[test]
fn a_block_parses_into_commands_outputs_and_exit_codes() {
    let doc = "text\n\n```sh\n$ not run\n```\n\n  ```console\n  $ echo a \\\n    b\n  a b\n\n  $ false\n  [exit: 1]\n  $ hearth serve &\n  ...\n  ```\n";
    let examples = parse(doc).expect("parses");
    assert_eq!(
        examples,
        vec![
            Example {
                line: 8,
                command: "echo a \\\n  b".to_string(),
                background: false,
                expected: lines(&["a b"]),
                exit: 0,
            },
            Example {
                line: 12,
                command: "false".to_string(),
                background: false,
                expected: Vec::new(),
                exit: 1,
            },
            Example {
                line: 14,
                command: "hearth serve".to_string(),
                background: true,
                expected: lines(&["..."]),
                exit: 0,
            },
        ]
    );
    assert!(parse("```console\noutput first\n```\n").is_err());
    assert!(parse("```console\n$ echo\n").is_err());
}

#[test]
fn a_mismatch_names_the_file_the_line_and_the_difference() {
    let example = Example {
        line: 7,
        command: "hearth deploy x".to_string(),
        background: false,
        expected: lines(&["deployed x: [..]", "version 1"]),
        exit: 0,
    };
    let path = repo().join("docs/versions.md");
    let good = Ran {
        output: lines(&["deployed x: 12 bytes", "version 1"]),
        exit: 0,
    };
    assert_eq!(mismatch(&path, &example, &good), None);
    let wrong = Ran {
        output: lines(&["deployed x: 12 bytes", "version 2"]),
        exit: 0,
    };
    let why = mismatch(&path, &example, &wrong).expect("a mismatch");
    assert!(
        why.starts_with("docs/versions.md:7: `hearth deploy x`"),
        "{why}"
    );
    assert!(
        why.contains("  deployed x: 12 bytes\n- version 1\n+ version 2\n"),
        "{why}"
    );
    let failed = Ran {
        output: good.output.clone(),
        exit: 1,
    };
    let why = mismatch(&path, &example, &failed).expect("a mismatch");
    assert!(why.contains("exited 1 (expected 0)"), "{why}");
}

#[test]
fn headings_make_github_anchors() {
    let doc = "# hearth\n## The two commands\n### `hearth tail`: live\n```sh\n# not a heading\n```\n## Limits\n## Limits\n";
    assert_eq!(
        anchors(doc),
        lines(&[
            "hearth",
            "the-two-commands",
            "hearth-tail-live",
            "limits",
            "limits-1"
        ])
    );
    let links = links(
        "see [a](docs/a.md#x) and `[b](not/a/link)` and ![c](c.png \"t\")\n\
         a [`code\nspan`](d.md) and `[e](not\nthis)`\n",
    );
    assert_eq!(
        links,
        vec![
            (1, "docs/a.md#x".to_string()),
            (1, "c.png".to_string()),
            (3, "d.md".to_string())
        ]
    );
}
