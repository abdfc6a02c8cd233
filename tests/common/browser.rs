//! A real browser driven as a person drives it: Debian's headless `chromium` over its DevTools
//! protocol (a WebSocket on a loopback port Chromium picks), so a test can load a page, click
//! the page's own links and read what they open. And URLs written for a command line: every
//! byte outside RFC 3986's unreserved characters percent-encoded.
//!
//! The protocol is spoken synchronously (tungstenite): a test's browser is one process and one
//! socket, and every command waits for its answer.

use serde_json::{json, Value};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

/// How long a page may take to show what a test waits for: generous, since the machines are
/// shared; a test that passes never waits it out.
const PATIENCE: Duration = Duration::from_secs(20);

/// `s` with every byte outside RFC 3986's unreserved characters (`A–Z a–z 0–9 - . _ ~`)
/// percent-encoded: safe in any component of a URL and on any program's command line.
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The `file://` URL of `path`, each segment percent-encoded.
pub fn file_url(path: &Path) -> String {
    let path = path.to_str().expect("a UTF-8 path");
    let segments: Vec<String> = path.split('/').map(percent_encode).collect();
    format!("file://{}", segments.join("/"))
}

/// A headless Chromium with a profile of its own, and the DevTools session of its one page.
pub struct Browser {
    process: Child,
    socket: WebSocket<TcpStream>,
    session: String,
    next_id: u64,
}

impl Browser {
    /// Starts Chromium with its profile in `dir` and opens a blank page to drive.
    pub fn launch(dir: &Path) -> Browser {
        let profile = dir.join("devtools-profile");
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).expect("a profile directory");
        let process = Command::new("chromium")
            .args(super::HEADLESS)
            .args([
                "--window-size=1400,1100",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium starts");
        // Chromium writes the port it chose, and its browser endpoint, once it listens.
        let announced = profile.join("DevToolsActivePort");
        let started = Instant::now();
        let (port, path) = loop {
            let text = std::fs::read_to_string(&announced).unwrap_or_default();
            let mut lines = text.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                break (port.to_owned(), path.to_owned());
            }
            assert!(
                started.elapsed() < PATIENCE,
                "chromium announced no DevTools port"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let stream = TcpStream::connect(format!("127.0.0.1:{port}")).expect("DevTools listens");
        let (socket, _) = tungstenite::client(format!("ws://127.0.0.1:{port}{path}"), stream)
            .expect("the DevTools handshake");
        let mut browser = Browser {
            process,
            socket,
            session: String::new(),
            next_id: 0,
        };
        let target = browser.command("Target.createTarget", json!({"url": "about:blank"}));
        let target = target["targetId"].as_str().expect("a target id").to_owned();
        let attached = browser.command(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        browser
    }

    /// Sends one command (to the page once attached) and returns its result, or the
    /// protocol's error as `Err`.
    fn try_command(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .expect("DevTools takes the command");
        loop {
            let Message::Text(text) = self.socket.read().expect("DevTools answers") else {
                continue;
            };
            let answer: Value = serde_json::from_str(text.as_str()).expect("DevTools speaks JSON");
            // Events, and answers to nothing this call asked, pass by.
            if answer["id"] != id {
                continue;
            }
            return match answer.get("error") {
                Some(error) => Err(error.clone()),
                None => Ok(answer["result"].clone()),
            };
        }
    }

    fn command(&mut self, method: &str, params: Value) -> Value {
        self.try_command(method, params.clone())
            .unwrap_or_else(|e| panic!("DevTools {method} {params}: {e}"))
    }

    /// Loads `url` in the page (what follows waits for what it needs).
    pub fn navigate(&mut self, url: &str) {
        let answer = self.command("Page.navigate", json!({"url": url}));
        assert!(answer.get("errorText").is_none(), "{url} loads: {answer}");
    }

    /// The value of the JavaScript `expression` in the page, or `None` while the page cannot
    /// answer (navigating) or the expression throws.
    pub fn evaluate(&mut self, expression: &str) -> Option<Value> {
        let answer = self
            .try_command(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .ok()?;
        if answer.get("exceptionDetails").is_some() {
            return None;
        }
        Some(answer["result"]["value"].clone())
    }

    /// Waits for `expression` to be truthy in the page and returns its value; fails the test,
    /// naming `what` and the page's text, when it is not within [`PATIENCE`].
    pub fn wait_for(&mut self, expression: &str, what: &str) -> Value {
        let started = Instant::now();
        loop {
            let value = self.evaluate(expression);
            match &value {
                Some(Value::Null | Value::Bool(false)) | None => {}
                Some(Value::String(s)) if s.is_empty() => {}
                Some(value) => return value.clone(),
            }
            if started.elapsed() > PATIENCE {
                let page = self.evaluate("location.href + '\\n' + document.body.innerText");
                panic!("{what}: not seen; the page: {page:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
