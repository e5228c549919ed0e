//! Serial consoles, dialled out: the agent opens no port. When the
//! desired state lists a console session, the agent connects to the
//! server (`/agent/v1/console/{session}`, a websocket, its host
//! credential as the bearer) and bridges it to the domain's serial
//! console through libvirt (`virDomainOpenConsole` on a non-blocking
//! stream). Each session is dialled once; a console that cannot be
//! opened says why on the person's screen and closes.
//!
//! Scrollback: each domain's serial port also logs to `console.log` in the
//! VM's directory (through virtlogd, which rotates it, so a guest that
//! floods its console fills no disk). A session starts with the last
//! [`SCROLLBACK`] bytes of that log, then `{"event":"live"}`, then what
//! the console prints now. The writer's controls come as text messages:
//! the terminal's size is set on the guest's serial line through the QEMU
//! guest agent (`stty`), Ctrl-Alt-Del is pressed on its keyboard.

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use kumo_api_types::{ConsoleControl, ConsoleEvent, ConsoleKeys, DesiredConsole};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use uuid::Uuid;

/// How long the bridge sleeps when neither side has anything.
const POLL: Duration = Duration::from_millis(10);

/// `VIR_DOMAIN_CONSOLE_FORCE`: a console left open (by an agent that
/// restarted) is taken over rather than refused.
const CONSOLE_FORCE: u32 = 1;

/// How much of a console's log a session starts with.
pub const SCROLLBACK: u64 = 1024 * 1024;

/// The file a VM's serial console logs to, in its directory.
pub fn log_path(vm_dir: &Path) -> PathBuf {
    vm_dir.join("console.log")
}

/// Linux input key codes (`VIR_KEYCODE_SET_LINUX`).
const KEY_LEFTCTRL: u32 = 29;
const KEY_LEFTALT: u32 = 56;
const KEY_DELETE: u32 = 111;

/// The consoles this agent dials. Dropped (the agent stops), its open
/// consoles end.
pub struct Consoles {
    dialer: Arc<Dialer>,
    dialled: Mutex<BTreeSet<Uuid>>,
    bridges: Mutex<Vec<tokio::task::AbortHandle>>,
}

/// What a bridge needs to dial the server and open a console.
struct Dialer {
    server: String,
    credential: String,
    libvirt_uri: String,
    /// Where VMs' directories are (their console logs).
    vms_dir: PathBuf,
}

impl Drop for Consoles {
    fn drop(&mut self) {
        for b in self
            .bridges
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            b.abort();
        }
    }
}

/// What the bridge's thread sends the server.
enum Out {
    Bytes(Vec<u8>),
    Live,
}

/// What the server sends the bridge's thread.
enum In {
    Bytes(Vec<u8>),
    Control(ConsoleControl),
}

impl Consoles {
    pub fn new(server: &str, credential: &str, libvirt_uri: &str, vms_dir: &Path) -> Arc<Consoles> {
        Arc::new(Consoles {
            dialer: Arc::new(Dialer {
                server: server.trim_end_matches('/').to_owned(),
                credential: credential.to_owned(),
                libvirt_uri: libvirt_uri.to_owned(),
                vms_dir: vms_dir.to_owned(),
            }),
            dialled: Mutex::default(),
            bridges: Mutex::default(),
        })
    }

    /// Dials each session not dialled yet; forgets those no longer listed.
    pub fn converge(&self, wanted: &[DesiredConsole]) {
        let mut dialled = self.dialled.lock().unwrap_or_else(|e| e.into_inner());
        dialled.retain(|s| wanted.iter().any(|w| w.session == *s));
        let mut bridges = self.bridges.lock().unwrap_or_else(|e| e.into_inner());
        bridges.retain(|b| !b.is_finished());
        for c in wanted {
            if dialled.insert(c.session) {
                let (dialer, c) = (self.dialer.clone(), c.clone());
                let task = tokio::spawn(async move {
                    match dialer.bridge(&c).await {
                        Ok(()) => tracing::info!(vm = %c.vm, "console closed"),
                        Err(e) => tracing::warn!(vm = %c.vm, error = %e, "console failed"),
                    }
                });
                bridges.push(task.abort_handle());
            }
        }
    }
}

impl Dialer {
    async fn bridge(&self, c: &DesiredConsole) -> Result<(), String> {
        let mut req = kumo_api_types::websocket_url(
            &self.server,
            &format!("/agent/v1/console/{}", c.session),
        )
        .into_client_request()
        .map_err(|e| format!("console URL: {e}"))?;
        let bearer = format!("Bearer {}", self.credential)
            .parse()
            .map_err(|_| "the host credential is not a header value".to_owned())?;
        req.headers_mut()
            .insert(axum::http::header::AUTHORIZATION, bearer);
        let (ws, _) = tokio_tungstenite::connect_async(req)
            .await
            .map_err(|e| format!("dialling the server: {e}"))?;
        let (mut to_server, mut from_server) = ws.split();
        let (to_guest, input) = std::sync::mpsc::channel::<In>();
        let (output, mut from_guest) = tokio::sync::mpsc::channel::<Out>(64);
        let (uri, vm) = (self.libvirt_uri.clone(), c.vm);
        let log = log_path(&self.vms_dir.join(vm.to_string()));
        std::thread::spawn(move || {
            if let Err(e) = pump(&uri, vm, &log, &input, &output) {
                let _ =
                    output.blocking_send(Out::Bytes(format!("\r\n[kumo: {e}]\r\n").into_bytes()));
            }
        });
        loop {
            tokio::select! {
                msg = from_server.next() => match msg {
                    Some(Ok(Message::Binary(b))) => {
                        if to_guest.send(In::Bytes(b.to_vec())).is_err() {
                            break;
                        }
                    }
                    Some(Ok(Message::Text(t))) => match serde_json::from_str(t.as_str()) {
                        Ok(c) => {
                            if to_guest.send(In::Control(c)).is_err() {
                                break;
                            }
                        }
                        Err(e) => tracing::debug!(vm = %c.vm, error = %e, "a console control the agent does not know"),
                    },
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
                out = from_guest.recv() => {
                    let m = match out {
                        Some(Out::Bytes(b)) => Message::Binary(b.into()),
                        Some(Out::Live) => Message::Text(serde_json::to_string(&ConsoleEvent::Live).unwrap_or_default().into()),
                        None => break,
                    };
                    if to_server.send(m).await.is_err() {
                        break;
                    }
                },
            }
        }
        drop(to_guest);
        let _ = to_server.close().await;
        Ok(())
    }
}

/// Bridges the domain's console and the channels until the console ends
/// or the input side is dropped. Blocking: runs on its own thread.
fn pump(
    uri: &str,
    vm: Uuid,
    log: &Path,
    input: &std::sync::mpsc::Receiver<In>,
    output: &tokio::sync::mpsc::Sender<Out>,
) -> Result<(), String> {
    use std::sync::mpsc::TryRecvError;
    ensure_event_loop();
    let conn = virt::connect::Connect::open(Some(uri)).map_err(|e| format!("libvirt: {e}"))?;
    let dom = conn
        .lookup_domain_by_uuid_string(&vm.to_string())
        .map_err(|_| "the VM has no domain on this host".to_owned())?;
    let stream = virt::stream::Stream::new(&conn, virt::sys::VIR_STREAM_NONBLOCK)
        .map_err(|e| format!("libvirt stream: {e}"))?;
    dom.open_console(None, &stream, CONSOLE_FORCE)
        .map_err(|e| format!("opening the console: {e}"))?;
    // The scrollback, read after the console opened: a few bytes may come
    // twice, none are missed.
    for chunk in scrollback(log).chunks(64 * 1024) {
        if output.blocking_send(Out::Bytes(chunk.to_vec())).is_err() {
            return Ok(());
        }
    }
    if output.blocking_send(Out::Live).is_err() {
        return Ok(());
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = Size::default();
    let ended = loop {
        let mut idle = true;
        match stream.recv(&mut buf) {
            Ok(n) if n > 0 => {
                idle = false;
                let n = usize::try_from(n).unwrap_or(0).min(buf.len());
                if output.blocking_send(Out::Bytes(buf[..n].to_vec())).is_err() {
                    break None;
                }
            }
            Ok(0) => break Some("the console ended".to_owned()),
            Ok(_) => {} // -2: nothing yet
            Err(e) => break Some(format!("the console failed: {e}")),
        }
        match input.try_recv() {
            Ok(In::Bytes(data)) => {
                idle = false;
                if let Err(e) = send_all(&stream, &data) {
                    break Some(e);
                }
            }
            Ok(In::Control(ConsoleControl::Resize { cols, rows })) => {
                idle = false;
                size.wanted = Some((cols, rows));
            }
            Ok(In::Control(ConsoleControl::Keys { keys })) => {
                idle = false;
                if let Err(e) = press(&dom, keys) {
                    let note = format!("\r\n[kumo: {e}]\r\n").into_bytes();
                    if output.blocking_send(Out::Bytes(note)).is_err() {
                        break None;
                    }
                }
            }
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => break None,
        }
        size.converge(&dom);
        if idle {
            std::thread::sleep(POLL);
        }
    };
    let _ = stream.abort();
    match ended {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// The terminal's size on the guest's serial line: the writer's latest,
/// set through the guest agent until it takes (the agent may be busy or
/// not up yet), tried again at most every [`SIZE_RETRY`].
#[derive(Default)]
struct Size {
    wanted: Option<(u16, u16)>,
    set: Option<(u16, u16)>,
    tried: Option<std::time::Instant>,
}

const SIZE_RETRY: Duration = Duration::from_secs(2);

impl Size {
    fn converge(&mut self, dom: &virt::domain::Domain) {
        let Some((cols, rows)) = self.wanted.filter(|w| self.set != Some(*w)) else {
            return;
        };
        if self.tried.is_some_and(|t| t.elapsed() < SIZE_RETRY) {
            return;
        }
        self.tried = Some(std::time::Instant::now());
        let cmd = serde_json::json!({
            "execute": "guest-exec",
            "arguments": {
                "path": "stty",
                "arg": ["-F", "/dev/ttyS0", "rows", rows.to_string(), "cols", cols.to_string()],
            },
        });
        // A guest without its agent (or stty) keeps the size it had.
        match crate::guest_files::GuestAgent::command(dom, &cmd, 2) {
            Ok(_) => self.set = self.wanted,
            Err(e) => tracing::debug!(error = %e, "console size not set in the guest yet"),
        }
    }
}

/// Presses keys on the domain's keyboard.
fn press(dom: &virt::domain::Domain, keys: ConsoleKeys) -> Result<(), String> {
    match keys {
        ConsoleKeys::CtrlAltDel => {
            let mut codes = [KEY_LEFTCTRL, KEY_LEFTALT, KEY_DELETE];
            dom.send_key(
                virt::sys::VIR_KEYCODE_SET_LINUX,
                0,
                codes.as_mut_ptr(),
                3,
                0,
            )
            .map_err(|e| format!("pressing Ctrl-Alt-Del: {e}"))
        }
    }
}

/// The last [`SCROLLBACK`] bytes the console logged: of its log, and of
/// the one before (virtlogd's `.0`) when the log was just rotated. Empty
/// when there is none (a domain defined before consoles logged).
fn scrollback(log: &Path) -> Vec<u8> {
    let tail = |path: &Path, want: u64| -> Vec<u8> {
        let Ok(mut f) = std::fs::File::open(path) else {
            return Vec::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let mut out = Vec::new();
        if f.seek(SeekFrom::Start(len.saturating_sub(want))).is_ok() {
            let _ = f.take(want).read_to_end(&mut out);
        }
        out
    };
    let now = tail(log, SCROLLBACK);
    let rest = SCROLLBACK - now.len() as u64;
    if rest == 0 {
        return now;
    }
    let mut older = log.as_os_str().to_owned();
    older.push(".0");
    let mut all = tail(Path::new(&older), rest);
    all.extend(now);
    all
}

/// libvirt's default event loop, run on a thread of its own: a
/// connection to a remote daemon reads a non-blocking stream's data only
/// while some event loop runs. Registered once per process, before the
/// consoles' connections are opened.
fn ensure_event_loop() {
    static EVENTS: std::sync::Once = std::sync::Once::new();
    EVENTS.call_once(|| {
        if virt::event::event_register_default_impl().is_ok() {
            std::thread::spawn(|| loop {
                if virt::event::event_run_default_impl().is_err() {
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
}

/// Writes all of `data` to a non-blocking stream.
fn send_all(stream: &virt::stream::Stream, mut data: &[u8]) -> Result<(), String> {
    let mut waited = Duration::ZERO;
    while !data.is_empty() {
        match stream.send(data) {
            Ok(n) if n > 0 => {
                let n = usize::try_from(n).unwrap_or(0).min(data.len());
                data = &data[n..];
                waited = Duration::ZERO;
            }
            Ok(_) => {
                if waited > Duration::from_secs(5) {
                    return Err("the console takes no input".into());
                }
                std::thread::sleep(POLL);
                waited += POLL;
            }
            Err(e) => return Err(format!("writing to the console: {e}")),
        }
    }
    Ok(())
}
