//! The serial console end to end on QEMU (TCG): a real guest with a shell
//! on ttyS0 under `qemu:///system`, its agent running its loop. A person
//! opens the console through the API's websocket (the agent dials the
//! server; no port on the host): the scrollback shows the guest's boot;
//! they type a command and read its output; `kumo vm console` in a
//! terminal (a pty here) takes over, passes its window size on, is told
//! when a second writer takes over, and leaves with Ctrl-]; `--log`
//! prints the boot log; a viewer watches but cannot type; Ctrl-Alt-Del
//! reboots the guest; revoking the token a console was opened with closes
//! it; an agent restart and a server restart close open consoles and a
//! new one opens.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use kumo_agent::run::Agent;
use kumo_api_types::{ConsoleTicket, Vm, VmState};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::e2e_qemu::{guest_dir, qemu_host, until, Cleanup};
use crate::harness::{Backend, TestServer};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What the test guest's init prints on its console as it boots (its
/// kernel is `quiet`).
const BOOTED: &str = "kumo test guest: guest agent port";

/// A console ticket for `vm` with `token`, opened.
async fn open(s: &TestServer, token: &str, mode: &str) -> (ConsoleTicket, Ws) {
    let r = s
        .http()
        .post(format!(
            "{}/api/v1/tenants/con/vms/vm-c/console?mode={mode}",
            s.url
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    let t: ConsoleTicket = r.json().await.unwrap();
    let url = format!("{}{}", s.url.replace("http://", "ws://"), t.url);
    let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    (t, ws)
}

/// What [`read_until`] waits for to stop at the next event (never in a
/// console's text).
const EVENT: &str = "\u{0}event";

/// Reads the console until its text contains `want` (or `limit` passes):
/// everything read, and the events seen.
async fn read_until(ws: &mut Ws, want: &str, limit: Duration) -> (String, Vec<serde_json::Value>) {
    let deadline = Instant::now() + limit;
    let (mut text, mut events) = (String::new(), Vec::new());
    while !text.contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => text.push_str(&String::from_utf8_lossy(&b)),
            Ok(Some(Ok(Message::Text(t)))) => {
                let e: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                if e["event"] == "live" {
                    continue;
                }
                events.push(e);
                if want == EVENT {
                    break;
                }
            }
            Ok(Some(Ok(_))) => {}
            Err(_) => break,
            // The websocket ended: as an event, for the asserts to show.
            Ok(end) => {
                events.push(json!({ "websocket": format!("{end:?}") }));
                break;
            }
        }
    }
    (text, events)
}

/// The next event on a console within `secs` (`null` if none came).
async fn next_event(ws: &mut Ws, secs: u64) -> serde_json::Value {
    let (_, ev) = read_until(ws, EVENT, Duration::from_secs(secs)).await;
    ev.into_iter().next().unwrap_or_default()
}

/// Reads a console from its opening until the `live` event: its
/// scrollback.
async fn scrollback(ws: &mut Ws) -> String {
    let mut text = String::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => text.push_str(&String::from_utf8_lossy(&b)),
            Ok(Some(Ok(Message::Text(t)))) => {
                let e: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                if e["event"] == "live" {
                    return text;
                }
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("the console ended before its scrollback did: {other:?}\n{text}"),
        }
    }
}

/// `kumo ARGS` in a terminal of its own (a pty of `rows`×`cols`), as a
/// person runs it.
struct Terminal {
    master: std::fs::File,
    child: std::process::Child,
    out: std::sync::mpsc::Receiver<Vec<u8>>,
    seen: String,
}

impl Terminal {
    fn spawn(args: &[&str], token: &str, rows: u16, cols: u16) -> Terminal {
        let size = nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None).unwrap();
        let slave = std::fs::File::from(pty.slave);
        let home = tempfile::tempdir().unwrap();
        let child = Command::new(crate::harness::bin("kumo"))
            .args(args)
            .env_clear()
            .env("HOME", home.path())
            .env("KUMO_TOKEN", token)
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave))
            .spawn()
            .unwrap();
        let master = std::fs::File::from(pty.master);
        let mut reader = master.try_clone().unwrap();
        let (tx, out) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _home = home;
            let mut buf = [0u8; 4096];
            // EIO once the command has exited and the pty has no reader.
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Terminal {
            master,
            child,
            out,
            seen: String::new(),
        }
    }

    fn type_keys(&mut self, keys: &[u8]) {
        self.master.write_all(keys).unwrap();
    }

    /// Waits until the terminal has shown `want` (after what earlier waits
    /// consumed); false after `limit`.
    fn shows(&mut self, want: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(i) = self.seen.find(want) {
                self.seen.drain(..i + want.len());
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(b) => self.seen.push_str(&String::from_utf8_lossy(&b)),
                Err(_) => return false,
            }
        }
    }

    /// Asserts that the terminal shows `want` within `secs` seconds.
    fn expect(&mut self, want: &str, secs: u64) {
        let shown = blocking(|| self.shows(want, Duration::from_secs(secs)));
        assert!(shown, "{want:?} not shown; the terminal: {}", self.seen);
    }

    /// Waits for the command to exit.
    fn exits(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn type_line(ws: &mut Ws, line: &str) {
    ws.send(Message::Binary(format!("{line}\n").into_bytes().into()))
        .await
        .unwrap();
}

/// Blocking waits on a [`Terminal`], off the runtime's workers' backs.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// `vm-c` of project `con` (the tiny template), once it runs; removed
/// with `cleanup`.
async fn tiny_running(s: &TestServer, cleanup: &mut Cleanup) -> Vm {
    let vm: Vm = s
        .admin
        .post(
            "/api/v1/tenants/con/vms",
            &json!({"name": "vm-c", "vcpus": 1, "memory_gib": 1, "disk_gib": 1, "template": "tiny"}),
        )
        .await
        .unwrap();
    cleanup.0.push(vm.id.to_string());
    until("vm-c to run", Duration::from_secs(120), async || {
        let v: Vm = s.admin.get("/api/v1/tenants/con/vms/vm-c").await.unwrap();
        (v.state == VmState::Running).then_some(())
    })
    .await;
    vm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_types_on_the_serial_console_through_the_server() {
    let guest = guest_dir();
    let mut s = TestServer::start(Backend::Sqlite).await;
    s.tenant("con").await;
    let (_work, config) = qemu_host(&s, &guest, "con-host").await;
    let agent = Agent::start(config.clone()).await.unwrap();
    let running = tokio::spawn(agent.run());
    let mut cleanup = Cleanup(Vec::new());
    tiny_running(&s, &mut cleanup).await;

    // The console opens as soon as the VM runs (its scrollback is what it
    // printed so far, then it goes live).
    let opened = Instant::now();
    let (t, mut a) = open(&s, &s.admin_token, "write").await;
    assert!(t.write && t.writer.is_none(), "{t:?}");
    scrollback(&mut a).await;

    // A writer types a command and reads what it printed (not its echo).
    let (out, _) = until("the shell's answer", Duration::from_secs(120), async || {
        type_line(&mut a, "echo kumo-$((6*7))").await;
        let (out, ev) = read_until(&mut a, "kumo-42", Duration::from_secs(5)).await;
        assert!(ev.is_empty(), "{ev:?}");
        out.contains("kumo-42").then_some((out, ()))
    })
    .await;
    println!("console: open → a command's output {:?}", opened.elapsed());
    assert!(out.contains("kumo-42"), "{out}");

    // A viewer watches: sees the writer's output, cannot type.
    let joined = Instant::now();
    let (t, mut viewer) = open(&s, &s.admin_token, "read").await;
    assert!(!t.write);
    let earlier = scrollback(&mut viewer).await;
    println!(
        "console: ticket → scrollback and live, joining an open console {:?}",
        joined.elapsed()
    );
    assert!(
        earlier.contains(BOOTED) && earlier.contains("kumo-42"),
        "a later viewer sees what came before: {earlier}"
    );
    viewer
        .send(Message::Binary(b"echo viewer-$((1+1))\n".to_vec().into()))
        .await
        .unwrap();
    type_line(&mut a, "echo seen-$((2*3))").await;
    let (seen, _) = read_until(&mut viewer, "seen-6", Duration::from_secs(30)).await;
    assert!(
        seen.contains("seen-6"),
        "the viewer sees the console: {seen}"
    );
    assert!(!seen.contains("viewer-2"), "a viewer cannot type: {seen}");

    // `kumo vm console` in a 33×101 terminal takes over (the first writer
    // is told); the guest's serial line gets the terminal's size.
    let url = s.url.clone();
    let console = ["--server", &url, "vm", "console", "vm-c", "--tenant", "con"];
    let mut term = Terminal::spawn(&console, &s.admin_token, 33, 101);
    term.expect("Connected to vm-c's console; Ctrl-] leaves.", 30);
    let ev = next_event(&mut a, 10).await;
    assert_eq!(ev["event"], "taken_over", "{ev}");
    until(
        "the window's size in the guest",
        Duration::from_secs(60),
        async || {
            blocking(|| {
                term.type_keys(b"stty size\r");
                term.shows("33 101", Duration::from_secs(3)).then_some(())
            })
        },
    )
    .await;
    blocking(|| term.type_keys(b"echo term-$((7*8))\r"));
    term.expect("term-56", 20);

    // A second writer takes over from the terminal, which says so; Ctrl-]
    // leaves.
    let (t, mut b) = open(&s, &s.admin_token, "write").await;
    assert_eq!(t.writer.as_deref(), Some("admin"), "{t:?}");
    term.expect("admin took the console over; read-only now", 10);
    type_line(&mut a, "echo old-$((3*3))").await;
    blocking(|| term.type_keys(b"echo older-$((3*4))\r"));
    type_line(&mut b, "echo new-$((4*4))").await;
    let (out, _) = read_until(&mut b, "new-16", Duration::from_secs(30)).await;
    assert!(
        out.contains("new-16") && !out.contains("old-9") && !out.contains("older-12"),
        "{out}"
    );
    blocking(|| term.type_keys(&[0x1d]));
    let left = blocking(|| term.exits(Duration::from_secs(10)));
    assert!(left.is_some_and(|s| s.success()), "{left:?}");
    term.expect("console closed: left", 5);
    drop(term);

    // `--log` prints the scrollback (the boot, the commands since) and
    // leaves.
    let log = Command::new(crate::harness::bin("kumo"))
        .args([
            "--server", &url, "vm", "console", "vm-c", "--tenant", "con", "--log",
        ])
        .env("KUMO_TOKEN", &s.admin_token)
        .env("HOME", "/nonexistent")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(
        log.status.success(),
        "{}",
        String::from_utf8_lossy(&log.stderr)
    );
    assert!(text.contains(BOOTED) && text.contains("new-16"), "{text}");

    // Ctrl-Alt-Del on the VM's keyboard: the guest reboots (it boots
    // again, live on the console) and its shell comes back.
    b.send(Message::Text(
        json!({"type": "keys", "keys": "ctrl-alt-del"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let (out, _) = read_until(&mut b, BOOTED, Duration::from_secs(60)).await;
    assert!(out.contains(BOOTED), "the guest rebooted: {out}");
    until(
        "the shell after the reboot",
        Duration::from_secs(120),
        async || {
            type_line(&mut b, "echo back-$((5*5))").await;
            let (out, _) = read_until(&mut b, "back-25", Duration::from_secs(5)).await;
            out.contains("back-25").then_some(())
        },
    )
    .await;

    // A console opened with a token ends within a second or two of the
    // token's revocation.
    let minted: serde_json::Value = s
        .admin
        .post("/api/v1/tokens", &json!({"description": "console"}))
        .await
        .unwrap();
    let token = minted["token"].as_str().unwrap().to_owned();
    let (_, mut c) = open(&s, &token, "read").await;
    let id = minted["id"].as_str().unwrap().to_owned();
    s.admin
        .delete(&format!("/api/v1/tokens/{id}"))
        .await
        .unwrap();
    let revoked = Instant::now();
    let ev = next_event(&mut c, 10).await;
    println!(
        "console: token revoked → console closed {:?}",
        revoked.elapsed()
    );
    assert_eq!(ev["event"], "closed", "{ev}");
    assert!(
        revoked.elapsed() < Duration::from_secs(3),
        "{:?}",
        revoked.elapsed()
    );

    // The agent restarts: open consoles close (they are told), and a new
    // one opens through the new agent.
    running.abort();
    let ev = next_event(&mut b, 10).await;
    assert_eq!(ev["event"], "closed", "{ev}");
    let agent = Agent::start(config.clone()).await.unwrap();
    let running = tokio::spawn(agent.run());
    let dialled = Instant::now();
    let (_, mut d) = open(&s, &s.admin_token, "write").await;
    // A new agent's console starts with the console's log on the host:
    // both boots and the commands typed before.
    let log = scrollback(&mut d).await;
    println!(
        "console: ticket → scrollback ({} bytes) and live, the agent dialling {:?}",
        log.len(),
        dialled.elapsed()
    );
    assert!(
        log.matches(BOOTED).count() == 2 && log.contains("new-16") && log.contains("back-25"),
        "{log}"
    );
    type_line(&mut d, "echo again-$((8*8))").await;
    let (out, _) = read_until(&mut d, "again-64", Duration::from_secs(30)).await;
    assert!(out.contains("again-64"), "{out}");

    // The server restarts: the console is told and closes; the agent
    // finds the new server and a new console opens.
    s.restart().await;
    let ev = next_event(&mut d, 10).await;
    assert_eq!(ev["event"], "closed", "{ev}");
    assert!(
        ev["reason"].as_str().unwrap_or("").contains("restarting"),
        "{ev}"
    );
    let (_, mut e) = open(&s, &s.admin_token, "write").await;
    scrollback(&mut e).await;
    type_line(&mut e, "echo fresh-$((9*9))").await;
    let (out, _) = read_until(&mut e, "fresh-81", Duration::from_secs(30)).await;
    assert!(out.contains("fresh-81"), "{out}");

    // The portal's console page in a browser: keys typed into xterm.js
    // reach the shell, a long line goes through the send-text box.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc");
    crate::sso::install_node_modules(&dir);
    let shots =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/portal-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let (kumo, token) = (s.url.clone(), s.admin_token.clone());
    let browsed = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(dir.join("console.mjs"))
            .args([&kumo, &token, "con", "vm-c", "ja-JP"])
            .arg(&shots)
            .current_dir(&dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&browsed.stdout);
    let seen: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "browser: {text} {}",
            String::from_utf8_lossy(&browsed.stderr)
        )
    });
    assert_eq!(seen["error"], serde_json::Value::Null, "{seen}");
    assert_eq!(seen["lang"], "ja", "{seen}");
    assert_eq!(seen["connected"], true, "{seen}");
    assert_eq!(seen["typed"], true, "{seen}");
    assert_eq!(seen["pasted"], true, "{seen}");
    assert_eq!(seen["console_errors"], json!([]), "{seen}");
    assert_eq!(seen["bad_responses"], json!([]), "{seen}");
    // The browser took typing over from the last writer, who was told.
    let ev = next_event(&mut e, 5).await;
    assert_eq!(ev["event"], "taken_over", "{ev}");

    // The VM stops: its console ends, and those on it are told.
    let _: Vm = s
        .admin
        .post("/api/v1/tenants/con/vms/vm-c/stop", &json!({}))
        .await
        .unwrap();
    let ev = next_event(&mut e, 60).await;
    assert_eq!(ev["reason"], "the VM's console ended", "{ev}");

    running.abort();
    s.stop().await;
}

/// HAProxy (Debian's), round robin over two replicas, as a child process
/// with its configuration in a temporary directory: where it listens.
struct Haproxy {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    async fn start(servers: &[std::net::SocketAddr]) -> Haproxy {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let backends: String = servers
            .iter()
            .enumerate()
            .map(|(i, a)| format!("  server r{i} {a}\n"))
            .collect();
        // Every request balanced on its own (the server side closed after
        // each), websockets tunnelled as long as they live.
        let cfg = format!(
            "defaults\n  mode http\n  option http-server-close\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n  timeout tunnel 1h\n\
             frontend kumo\n  bind 127.0.0.1:{port}\n  default_backend replicas\n\
             backend replicas\n  balance roundrobin\n{backends}"
        );
        let file = dir.path().join("haproxy.cfg");
        std::fs::write(&file, cfg).unwrap();
        let bin = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("haproxy");
        let child = Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(&file)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("haproxy (Debian's haproxy; `./x test` installs it): {e}"));
        let url = format!("http://127.0.0.1:{port}");
        until("haproxy to listen", Duration::from_secs(10), async || {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        Haproxy {
            child,
            url,
            _dir: dir,
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Consoles relayed between two replicas, as counted in their metrics.
fn relays(st: &kumo_server::AppState) -> u64 {
    st.metrics
        .encode()
        .lines()
        .filter(|l| {
            l.starts_with("kumo_console_person_relays_total ")
                || l.starts_with("kumo_console_dial_relays_total ")
        })
        .filter_map(|l| l.split(' ').nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Two replicas on one PostgreSQL database behind HAProxy, the real agent
/// and the QEMU guest reaching them only through it: the console opens
/// several times, each time wherever the person's requests and the
/// agent's dial land, and a command typed is answered each time; at
/// least one opening met its console on the other replica (relayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_opens_through_a_load_balancer_over_two_replicas() {
    let guest = guest_dir();
    let s = TestServer::start(Backend::Postgres).await;
    s.tenant("con").await;
    let b = kumo_server::RunningServer::start(s.server.state.config.as_ref().clone())
        .await
        .unwrap();
    let lb = Haproxy::start(&[s.server.addr, b.addr]).await;
    let (_work, mut config) = qemu_host(&s, &guest, "con-lb").await;
    config.server = lb.url.clone();
    let agent = Agent::start(config).await.unwrap();
    let running = tokio::spawn(agent.run());
    let mut cleanup = Cleanup(Vec::new());
    tiny_running(&s, &mut cleanup).await;

    let http = s.http();
    for i in 1..=4u32 {
        let opened = Instant::now();
        let r = http
            .post(format!("{}/api/v1/tenants/con/vms/vm-c/console", lb.url))
            .bearer_auth(&s.admin_token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
        let t: ConsoleTicket = r.json().await.unwrap();
        // Every other time one more request in between: the ticket and
        // the websocket land on the same replica, then on different ones.
        if i % 2 == 0 {
            http.get(format!("{}/healthz", lb.url))
                .send()
                .await
                .unwrap();
        }
        let url = format!("{}{}", lb.url.replace("http://", "ws://"), t.url);
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        scrollback(&mut ws).await;
        let want = format!("lb-{}", i * 7);
        let (out, _) = until("the shell's answer", Duration::from_secs(120), async || {
            type_line(&mut ws, &format!("echo lb-$(({i}*7))")).await;
            let (out, ev) = read_until(&mut ws, &want, Duration::from_secs(5)).await;
            assert!(ev.iter().all(|e| e["event"] == "taken_over"), "{ev:?}");
            out.contains(&want).then_some((out, ()))
        })
        .await;
        assert!(out.contains(&want), "{out}");
        println!(
            "console through haproxy #{i}: open → a command's output {:?} (relays so far: A {}, B {})",
            opened.elapsed(),
            relays(&s.server.state),
            relays(&b.state)
        );
        let _ = ws.close(None).await;
    }
    assert!(
        relays(&s.server.state) + relays(&b.state) >= 1,
        "no console met its person or dial on the other replica"
    );

    running.abort();
    drop(lb);
    b.stop().await.unwrap();
    s.stop().await;
}
