//! Serial consoles, dialled out: the agent opens no port. When the
//! desired state lists a console session, the agent connects to the
//! server (`/agent/v1/console/{session}`, a websocket, its host
//! credential as the bearer) and bridges it to the domain's serial
//! console through libvirt (`virDomainOpenConsole` on a non-blocking
//! stream). Each session is dialled once; a console that cannot be
//! opened says why on the person's screen and closes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use kumo_api_types::DesiredConsole;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use uuid::Uuid;

/// How long the bridge sleeps when neither side has anything.
const POLL: Duration = Duration::from_millis(10);

/// `VIR_DOMAIN_CONSOLE_FORCE`: a console left open (by an agent that
/// restarted) is taken over rather than refused.
const CONSOLE_FORCE: u32 = 1;

/// The consoles this agent dials.
pub struct Consoles {
    server: String,
    credential: String,
    libvirt_uri: String,
    dialled: Mutex<BTreeSet<Uuid>>,
}

impl Consoles {
    pub fn new(server: &str, credential: &str, libvirt_uri: &str) -> Arc<Consoles> {
        Arc::new(Consoles {
            server: server.trim_end_matches('/').to_owned(),
            credential: credential.to_owned(),
            libvirt_uri: libvirt_uri.to_owned(),
            dialled: Mutex::default(),
        })
    }

    /// Dials each session not dialled yet; forgets those no longer listed.
    pub fn converge(self: &Arc<Self>, wanted: &[DesiredConsole]) {
        let mut dialled = self.dialled.lock().unwrap_or_else(|e| e.into_inner());
        dialled.retain(|s| wanted.iter().any(|w| w.session == *s));
        for c in wanted {
            if dialled.insert(c.session) {
                let (me, c) = (self.clone(), c.clone());
                tokio::spawn(async move {
                    match me.bridge(&c).await {
                        Ok(()) => tracing::info!(vm = %c.vm, "console closed"),
                        Err(e) => tracing::warn!(vm = %c.vm, error = %e, "console failed"),
                    }
                });
            }
        }
    }

    /// The server's websocket URL for a session.
    fn url(&self, session: Uuid) -> String {
        let base = if let Some(rest) = self.server.strip_prefix("https://") {
            format!("wss://{rest}")
        } else if let Some(rest) = self.server.strip_prefix("http://") {
            format!("ws://{rest}")
        } else {
            self.server.clone()
        };
        format!("{base}/agent/v1/console/{session}")
    }

    async fn bridge(&self, c: &DesiredConsole) -> Result<(), String> {
        let mut req = self
            .url(c.session)
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
        let (to_guest, input) = std::sync::mpsc::channel::<Vec<u8>>();
        let (output, mut from_guest) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
        let (uri, vm) = (self.libvirt_uri.clone(), c.vm);
        std::thread::spawn(move || {
            if let Err(e) = pump(&uri, vm, &input, &output) {
                let _ = output.blocking_send(format!("\r\n[kumo: {e}]\r\n").into_bytes());
            }
        });
        loop {
            tokio::select! {
                msg = from_server.next() => match msg {
                    Some(Ok(Message::Binary(b))) => {
                        if to_guest.send(b.to_vec()).is_err() {
                            break;
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
                out = from_guest.recv() => match out {
                    Some(b) => {
                        if to_server.send(Message::Binary(b.into())).await.is_err() {
                            break;
                        }
                    }
                    None => break,
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
    input: &std::sync::mpsc::Receiver<Vec<u8>>,
    output: &tokio::sync::mpsc::Sender<Vec<u8>>,
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
    let mut buf = vec![0u8; 64 * 1024];
    let ended = loop {
        let mut idle = true;
        match stream.recv(&mut buf) {
            Ok(n) if n > 0 => {
                idle = false;
                let n = usize::try_from(n).unwrap_or(0).min(buf.len());
                if output.blocking_send(buf[..n].to_vec()).is_err() {
                    break None;
                }
            }
            Ok(0) => break Some("the console ended".to_owned()),
            Ok(_) => {} // -2: nothing yet
            Err(e) => break Some(format!("the console failed: {e}")),
        }
        match input.try_recv() {
            Ok(data) => {
                idle = false;
                if let Err(e) = send_all(&stream, &data) {
                    break Some(e);
                }
            }
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => break None,
        }
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
