//! A real browser for the dashboard's tests: Debian's Chromium, headless, loading a page, running its script
//! for a stretch of virtual time (its refresh timers fire, its fetches complete) and printing the DOM it ends
//! with. `e2e/tools/chromium.sh` installs it (CI runs it beside the build); a test that finds no browser fails
//! saying so, never skips.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The browser: `$WS_CHROMIUM`, else `chromium` (Debian) or `chromium-browser` on the PATH.
pub fn chromium() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("WS_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|n| dir.join(n)))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "no Chromium on the PATH: install it with `bash e2e/tools/chromium.sh` (or set WS_CHROMIUM)".into()
        })
}

/// The DOM of `url` once loaded, and then after `script_ms` milliseconds of the page's virtual time (0: none),
/// as the browser serialises it.
/// The browser runs with a profile of its own (removed after) and gives up after `deadline`.
pub fn dump_dom(url: &str, script_ms: u64, deadline: Duration) -> Result<String, String> {
    let profile = std::env::temp_dir().join(format!("ws-chromium-{}-{}", std::process::id(), unique()));
    let mut cmd = Command::new(chromium()?);
    cmd.args([
        "--headless",
        "--no-sandbox", // CI runs as root, where Chromium's sandbox refuses to start.
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        &format!("--user-data-dir={}", profile.display()),
    ]);
    // Without a budget the DOM is printed once the page has loaded (a budget of 0 never ends).
    if script_ms > 0 {
        cmd.arg(format!("--virtual-time-budget={script_ms}"));
    }
    cmd.args(["--dump-dom", url]);
    let out = run_with_deadline(cmd, deadline);
    let _ = std::fs::remove_dir_all(&profile);
    let out = out?;
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !dom.contains("<html") {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "chromium --dump-dom {url}: {} ({} bytes of DOM); stderr ends:\n{}",
            out.status,
            dom.len(),
            tail(&err)
        ));
    }
    Ok(dom)
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn tail(s: &str) -> &str {
    let start = s.len().saturating_sub(2000);
    s.char_indices().map(|(i, _)| i).find(|&i| i >= start).map_or("", |i| &s[i..])
}

/// Runs `cmd` to its end, killing it at `deadline`.
fn run_with_deadline(mut cmd: Command, deadline: Duration) -> Result<std::process::Output, String> {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    // A group of its own, so that a browser killed at the deadline takes its renderers and zygote with it.
    cmd.process_group(0);
    let child =
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| format!("cannot start chromium: {e}"))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(out) => out.map_err(|e| format!("chromium: {e}")),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", "--", &format!("-{pid}")]).status();
            Err(format!("chromium did not finish within {}s", deadline.as_secs()))
        }
    }
}

/// The text of the first element opened by `open` (e.g. `<figure id="loss"`) up to its closing `close` tag
/// (`</figure>`), if the DOM has one.
pub fn element<'a>(dom: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = dom.find(open)?;
    let end = dom[start..].find(close)? + start + close.len();
    Some(&dom[start..end])
}

/// The values of attribute `name` in `html`, in order (`data-name="x"` gives `x`).
pub fn attributes(html: &str, name: &str) -> Vec<String> {
    let key = format!(" {name}=\"");
    html.match_indices(&key)
        .filter_map(|(i, _)| {
            let rest = &html[i + key.len()..];
            rest.find('"').map(|end| rest[..end].to_string())
        })
        .collect()
}

/// A running `wsctl dashboard`, stopped when dropped.
pub struct Dashboard {
    child: std::process::Child,
    /// Its root, `http://127.0.0.1:PORT/`.
    pub url: String,
    /// Its port.
    pub port: u16,
}

impl Dashboard {
    /// Starts `wsctl dashboard ARGS… --port 0` (with `kubeconfig` as KUBECONFIG when given) and waits up to 30 s
    /// for the address it prints first.
    pub fn start(
        wsctl: &std::path::Path,
        args: &[&str],
        kubeconfig: Option<&std::path::Path>,
    ) -> Result<Dashboard, String> {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut cmd = Command::new(wsctl);
        cmd.arg("dashboard").args(args).args(["--port", "0"]).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if let Some(kc) = kubeconfig {
            cmd.env("KUBECONFIG", kc);
        }
        let mut child = cmd.spawn().map_err(|e| format!("cannot start wsctl dashboard: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(30));
        let url = line.ok().and_then(|l| l.split_whitespace().find(|w| w.starts_with("http://")).map(String::from));
        let Some(url) = url else {
            let _ = child.kill();
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            return Err(format!("wsctl dashboard printed no address within 30s ({status})"));
        };
        let port = url.trim_end_matches('/').rsplit(':').next().and_then(|p| p.parse().ok()).ok_or("no port")?;
        Ok(Dashboard { child, url, port })
    }

    /// `GET path` with Host `host` (`None`: the dashboard's own address), over a plain socket.
    pub fn get(&self, path: &str, host: Option<&str>) -> Result<Answer, String> {
        use std::io::{Read, Write};
        let own = format!("127.0.0.1:{}", self.port);
        let mut s = std::net::TcpStream::connect(&own).map_err(|e| format!("connect {own}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", host.unwrap_or(&own));
        s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).map_err(|e| format!("read {path}: {e}"))?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("not an HTTP answer: {text}"))?;
        let mut lines = head.lines();
        let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Ok(Answer { status, headers, body: body.to_string() })
    }
}

/// An HTTP answer.
pub struct Answer {
    /// Its status code.
    pub status: u16,
    /// Its headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: String,
}

impl Answer {
    /// The value of header `name` (lower case), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether something listens on TCP `port` at an address other than 127.0.0.1 (from /proc/net/tcp and tcp6).
pub fn listens_beyond_loopback(port: u16) -> bool {
    let port_hex = format!("{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).unwrap_or_default().lines().skip(1).any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            let (Some(local), Some(state)) = (cells.get(1), cells.get(3)) else { return false };
            let listening = *state == "0A";
            let (addr, p) = local.split_once(':').unwrap_or_default();
            listening && p == port_hex && addr != "0100007F"
        })
    })
}
