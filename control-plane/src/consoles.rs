//! The relay between people and VMs' serial consoles.
//!
//! Agents stay outbound-only: a console is reached by asking the VM's
//! agent (through its desired state) to dial the server with a one-time
//! session id; the hub hands the agent's byte channels to a [`Link`], one
//! per VM, which fans the console's output out to every attached person
//! and takes input from one writer at a time. A person attaches with a
//! one-time ticket, minted by an authenticated request, valid
//! [`TICKET_TTL`]; only its SHA-256 is kept. A tenant has at most
//! [`MAX_WAITING`] tickets and dials waiting at once (each dial wakes an
//! agent) and [`MAX_OPEN`] consoles open.
//!
//! Across replicas (several servers on one database behind a load
//! balancer), tickets, dials, each VM's link's *home* replica and open
//! consoles are database rows (`crate::app::consoles`): a link lives in
//! one replica, the home, and the person and the agent meet there
//! whichever replicas they reach. A person who opens a ticket at another
//! replica is relayed to the home over an internal websocket, and so is
//! an agent that dials another replica than the one its session waits
//! at. Replicas prove themselves to each other with a key they share
//! ([`ReplicaKey`], a file every replica has); the relay carries the
//! already authorised ticket or the dialling host, so the internal
//! endpoints give nothing a tenant or an agent could not already reach.
//! Everything about a console (its holder's standing re-read every
//! second, read-only viewers, scrollback, takeover) happens at the home;
//! the other replica only passes frames.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kumo_api_types::ConsoleControl;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use uuid::Uuid;

/// How long a ticket may wait to be opened, and an agent to dial.
pub const TICKET_TTL: Duration = Duration::from_secs(60);

/// Tickets and dials one tenant may have waiting at once.
pub const MAX_WAITING: usize = 16;

/// Consoles one tenant's people may have open at once (each is a relay
/// task, a copy of the scrollback on opening and a credential check a
/// second).
pub const MAX_OPEN: usize = 64;

/// A console no one watches for between one and two of these is closed.
const UNWATCHED: Duration = Duration::from_secs(30);

/// Chunks of console output a slow viewer may lag behind before it
/// misses some.
const FAN_OUT: usize = 1024;

/// A tenant has [`MAX_OPEN`] consoles open already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyOpen;

/// What a person's session was opened with, to end it with that.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Credential {
    /// An API token (its id).
    Token(Uuid),
    /// A portal session (its id: the SHA-256 of the cookie's secret).
    Session(String),
}

/// An authorised console session: what a ticket holds, and what a
/// replica relaying its holder tells the link's home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    pub tenant: Uuid,
    pub vm: Uuid,
    pub host: Uuid,
    pub user: String,
    pub credential: Credential,
    pub write: bool,
}

/// The SHA-256 of a ticket's secret, in hex: what is kept of it.
pub fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The agent's side of a console: output from the guest, input to it.
pub struct AgentEnds {
    pub output: mpsc::Receiver<FromAgent>,
    pub input: mpsc::Sender<ToAgent>,
}

/// What a VM's agent sends: the console's bytes, first its scrollback
/// then, after [`FromAgent::Live`], what it prints now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromAgent {
    Output(Bytes),
    Live,
}

/// What the writer sends the VM's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToAgent {
    Input(Bytes),
    Control(ConsoleControl),
}

/// How much of a console's output a link keeps for people who attach
/// later (the agent's scrollback is as long).
pub const SCROLLBACK: usize = 1024 * 1024;

/// The output a link has relayed, the last [`SCROLLBACK`] bytes of it.
#[derive(Default)]
struct Recent {
    bytes: VecDeque<u8>,
    /// Whether the agent's scrollback has all come.
    live: bool,
}

struct Dial {
    host: Uuid,
    expires: Instant,
    tx: oneshot::Sender<AgentEnds>,
}

/// A VM's console, live: the agent's connection shared by its people.
pub struct Link {
    vm: Uuid,
    output: broadcast::Sender<FromAgent>,
    /// Appended to and broadcast under one lock, so that a person
    /// attaching gets each byte once: in the backlog or from `output`.
    recent: Mutex<Recent>,
    input: mpsc::Sender<ToAgent>,
    writer: Mutex<Option<Writer>>,
    /// Set once the agent's side ended.
    closed: watch::Sender<bool>,
}

struct Writer {
    id: u64,
    user: String,
    /// Told who took over.
    demoted: watch::Sender<Option<String>>,
}

/// One person on a console.
pub struct Attached {
    _seat: Seat,
    pub link: Arc<Link>,
    pub id: u64,
    /// What the console printed before this person came (up to
    /// [`SCROLLBACK`]), and whether the live output had begun by then.
    pub backlog: Vec<u8>,
    pub live: bool,
    pub output: broadcast::Receiver<FromAgent>,
    /// Who took the console over from this writer, once someone did.
    pub demoted: watch::Receiver<Option<String>>,
    /// Whether the agent's side ended.
    pub closed: watch::Receiver<bool>,
    /// The writer it replaced, if any.
    pub took_over_from: Option<String>,
}

impl Link {
    /// Keeps a chunk from the agent for later attachers and sends it to
    /// everyone attached now.
    fn relay(&self, chunk: FromAgent) {
        let mut r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        match &chunk {
            FromAgent::Output(b) => {
                r.bytes.extend(b.iter());
                let over = r.bytes.len().saturating_sub(SCROLLBACK);
                r.bytes.drain(..over);
            }
            FromAgent::Live => r.live = true,
        }
        let _ = self.output.send(chunk);
    }

    /// Sends keystrokes or a control from `id`, if it is still the writer.
    pub async fn write(&self, id: u64, data: ToAgent) -> bool {
        let is_writer = self
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|w| w.id == id);
        is_writer && self.input.send(data).await.is_ok()
    }

    /// The current writer's name.
    pub fn writer(&self) -> Option<String> {
        self.writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|w| w.user.clone())
    }

    /// Becomes `true` once the agent's side ended.
    pub fn closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    /// `id` leaves: the console has no writer if it was.
    pub fn leave(&self, id: u64) {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if w.as_ref().is_some_and(|w| w.id == id) {
            *w = None;
        }
    }
}

/// Every console this server relays, and who this server is to the
/// other replicas.
pub struct ConsoleHub {
    /// This replica (a new one each start).
    replica: Uuid,
    /// Where the other replicas reach this one, and its key: set once at
    /// start.
    identity: OnceLock<(String, ReplicaKey)>,
    dials: Mutex<HashMap<Uuid, Dial>>,
    links: Mutex<HashMap<Uuid, Arc<Link>>>,
    next: AtomicU64,
    /// Set when the server shuts down: every console's relays end (an
    /// upgraded connection outlives the server's graceful shutdown).
    closing: watch::Sender<bool>,
    /// Open consoles by tenant.
    open: Arc<Mutex<HashMap<Uuid, usize>>>,
}

impl Default for ConsoleHub {
    fn default() -> ConsoleHub {
        ConsoleHub {
            replica: Uuid::new_v4(),
            identity: OnceLock::new(),
            dials: Mutex::default(),
            links: Mutex::default(),
            next: AtomicU64::default(),
            closing: watch::Sender::new(false),
            open: Arc::default(),
        }
    }
}

/// One of a tenant's [`MAX_OPEN`] open consoles, given back when dropped.
pub struct Seat {
    open: Arc<Mutex<HashMap<Uuid, usize>>>,
    tenant: Uuid,
    /// Gives back what else holds the seat (its row, for the count
    /// across replicas).
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl Seat {
    /// `f` runs when the seat is given back.
    pub fn on_release(&mut self, f: impl FnOnce() + Send + 'static) {
        self.release = Some(Box::new(f));
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        if let Some(f) = self.release.take() {
            f();
        }
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

impl ConsoleHub {
    /// This replica's id.
    pub fn replica(&self) -> Uuid {
        self.replica
    }

    /// Sets where the other replicas reach this one, and the key they
    /// share (once; later calls change nothing).
    pub fn identify(&self, url: String, key: ReplicaKey) {
        let _ = self.identity.set((url, key));
    }

    /// Where the other replicas reach this one, once identified.
    pub fn url(&self) -> Option<&str> {
        self.identity.get().map(|(u, _)| u.as_str())
    }

    /// The replicas' shared key, once identified.
    pub fn key(&self) -> Option<&ReplicaKey> {
        self.identity.get().map(|(_, k)| k)
    }

    /// The live console of a VM, if any.
    pub fn link(&self, vm: Uuid) -> Option<Arc<Link>> {
        let links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        links.get(&vm).filter(|l| !*l.closed.borrow()).cloned()
    }

    /// Asks for a VM's agent to dial: answers the session id to list in
    /// its host's desired state and what the dial will bring.
    pub fn dial(&self, t: &Ticket) -> (Uuid, oneshot::Receiver<AgentEnds>) {
        let host = t.host;
        let session = Uuid::new_v4();
        let (tx, rx) = oneshot::channel();
        let mut d = self.dials.lock().unwrap_or_else(|e| e.into_inner());
        d.retain(|_, d| d.expires > Instant::now() && !d.tx.is_closed());
        d.insert(
            session,
            Dial {
                host,
                expires: Instant::now() + TICKET_TTL,
                tx,
            },
        );
        (session, rx)
    }

    /// Whether a person here waits for `session` to be dialled.
    pub fn waits_for(&self, session: Uuid) -> bool {
        let d = self.dials.lock().unwrap_or_else(|e| e.into_inner());
        d.get(&session)
            .is_some_and(|d| d.expires > Instant::now() && !d.tx.is_closed())
    }

    /// An agent dialled `session`: only the host it was asked of, once.
    /// Answers the channels the agent's connection is pumped through.
    pub fn answer(
        &self,
        host: Uuid,
        session: Uuid,
    ) -> Option<(mpsc::Sender<FromAgent>, mpsc::Receiver<ToAgent>)> {
        let mut d = self.dials.lock().unwrap_or_else(|e| e.into_inner());
        if d.get(&session)?.host != host {
            return None;
        }
        let dial = d.remove(&session)?;
        if dial.expires <= Instant::now() {
            return None;
        }
        let (out_tx, out_rx) = mpsc::channel(64);
        let (in_tx, in_rx) = mpsc::channel(64);
        dial.tx
            .send(AgentEnds {
                output: out_rx,
                input: in_tx,
            })
            .ok()?;
        Some((out_tx, in_rx))
    }

    /// Makes the link of a VM from its agent's dial; its output is
    /// relayed until the agent's side ends, then the link goes.
    pub fn connect(self: &Arc<Self>, vm: Uuid, ends: AgentEnds) -> Arc<Link> {
        let (output, _) = broadcast::channel(FAN_OUT);
        let (closed, _) = watch::channel(false);
        let link = Arc::new(Link {
            vm,
            output,
            recent: Mutex::default(),
            input: ends.input,
            writer: Mutex::new(None),
            closed,
        });
        self.links
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(vm, link.clone());
        let (hub, l) = (self.clone(), link.clone());
        let mut from_agent = ends.output;
        tokio::spawn(async move {
            // Ends when the agent's side does, or when no one has been
            // attached for a while (the agent's connection then closes).
            let mut check = tokio::time::interval(UNWATCHED);
            check.tick().await;
            let mut watched = true;
            loop {
                tokio::select! {
                    chunk = from_agent.recv() => match chunk {
                        // No one attached is not an error: the chunk is dropped.
                        Some(chunk) => l.relay(chunk),
                        None => break,
                    },
                    _ = check.tick() => {
                        let now = l.output.receiver_count() > 0;
                        if !now && !watched {
                            break;
                        }
                        watched = now;
                    }
                }
            }
            l.closed.send_replace(true);
            let mut links = hub.links.lock().unwrap_or_else(|e| e.into_inner());
            if links.get(&l.vm).is_some_and(|x| Arc::ptr_eq(x, &l)) {
                links.remove(&l.vm);
            }
        });
        link
    }

    /// A seat for one more open console of `tenant`, unless it has
    /// [`MAX_OPEN`] already.
    pub fn seat(&self, tenant: Uuid) -> Result<Seat, TooManyOpen> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(tenant).or_default();
        if *n >= MAX_OPEN {
            return Err(TooManyOpen);
        }
        *n += 1;
        Ok(Seat {
            open: self.open.clone(),
            tenant,
            release: None,
        })
    }

    /// Ends every console: the server is shutting down.
    pub fn close_all(&self) {
        self.closing.send_replace(true);
    }

    /// Becomes `true` when the server shuts down.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Attaches a person to a link: as the writer (taking over from the
    /// one before, who is told) or as a viewer.
    pub fn attach(&self, link: &Arc<Link>, seat: Seat, user: &str, write: bool) -> Attached {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (demoted_tx, demoted) = watch::channel(None);
        let mut took_over_from = None;
        if write {
            let mut w = link.writer.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(old) = w.take() {
                old.demoted.send_replace(Some(user.to_owned()));
                took_over_from = Some(old.user);
            }
            *w = Some(Writer {
                id,
                user: user.to_owned(),
                demoted: demoted_tx,
            });
        }
        let (backlog, live, output) = {
            let r = link.recent.lock().unwrap_or_else(|e| e.into_inner());
            let (a, b) = r.bytes.as_slices();
            ([a, b].concat(), r.live, link.output.subscribe())
        };
        Attached {
            _seat: seat,
            link: link.clone(),
            id,
            backlog,
            live,
            output,
            demoted,
            closed: link.closed.subscribe(),
            took_over_from,
        }
    }
}

/// The header a replica shows its key in, to another replica.
pub const KEY_HEADER: &str = "kumo-replica-key";
/// The header a relayed person's ticket comes in (JSON, base64url).
pub const TICKET_HEADER: &str = "kumo-console-ticket";
/// The header naming the host whose agent's dial is relayed.
pub const HOST_HEADER: &str = "kumo-console-host";

/// How long a replica waits for another to take a relayed console: the
/// home may have to wait for the agent's dial first.
pub const RELAY_TIMEOUT: Duration = Duration::from_secs(30);

/// The key replicas prove themselves to each other with: 32 random bytes,
/// hex, in a file (0600) every replica has. Only its SHA-256 is compared
/// (in constant time), and neither is ever printed.
pub struct ReplicaKey {
    secret: String,
    digest: [u8; 32],
}

impl std::fmt::Debug for ReplicaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplicaKey(…)")
    }
}

impl ReplicaKey {
    fn from_hex(text: &str) -> Option<ReplicaKey> {
        let text = text.trim();
        let bytes = hex::decode(text).ok().filter(|b| b.len() == 32)?;
        Some(ReplicaKey {
            secret: hex::encode(&bytes),
            digest: Sha256::digest(hex::encode(&bytes).as_bytes()).into(),
        })
    }

    /// Reads the key from `path`, making it (0600, 32 random bytes) when
    /// there is none: a lone replica needs no setup; replicas on several
    /// machines are given the same file.
    pub fn load_or_make(path: &std::path::Path) -> Result<ReplicaKey, String> {
        use std::io::Write;
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut bytes = [0u8; 32];
                ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
                    .map_err(|_| "no randomness for the replica key".to_owned())?;
                let made = {
                    use std::os::unix::fs::OpenOptionsExt;
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(path)
                };
                match made {
                    Ok(mut f) => f
                        .write_all(hex::encode(bytes).as_bytes())
                        .map_err(|e| format!("{}: {e}", path.display()))?,
                    // Another replica on this data directory made it first.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("{}: {e}", path.display())),
                }
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        ReplicaKey::from_hex(&text)
            .ok_or_else(|| format!("{}: not 32 bytes in hex", path.display()))
    }

    /// Whether `presented` is this key.
    pub fn verify(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        let d: [u8; 32] = Sha256::digest(presented.trim().as_bytes()).into();
        bool::from(d.ct_eq(&self.digest))
    }
}

/// A websocket to another replica's internal endpoint.
pub type Upstream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Why another replica did not take a relayed console.
#[derive(Debug)]
pub enum RelayError {
    /// It answered with a problem (status, detail): its answer stands.
    Refused(u16, String),
    /// It could not be reached or did not answer in time.
    Unreachable(String),
}

/// Opens `path` on the replica at `base` as a websocket, with the
/// replicas' key and `headers`.
pub async fn relay(
    base: &str,
    path: &str,
    key: &ReplicaKey,
    headers: &[(&'static str, String)],
) -> Result<Upstream, RelayError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Error;
    let bad = |e: &dyn std::fmt::Display| RelayError::Unreachable(e.to_string());
    let mut req = kumo_api_types::websocket_url(base, path)
        .into_client_request()
        .map_err(|e| bad(&e))?;
    let h = req.headers_mut();
    h.insert(
        KEY_HEADER,
        key.secret.parse().map_err(|_| bad(&"the replica key"))?,
    );
    for (name, value) in headers {
        h.insert(*name, value.parse().map_err(|_| bad(name))?);
    }
    match tokio::time::timeout(RELAY_TIMEOUT, tokio_tungstenite::connect_async(req)).await {
        Err(_) => Err(RelayError::Unreachable(format!(
            "no answer within {RELAY_TIMEOUT:?}"
        ))),
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(Error::Http(resp))) => {
            let detail = resp
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
                .and_then(|v| v.get("detail")?.as_str().map(str::to_owned))
                .unwrap_or_default();
            Err(RelayError::Refused(resp.status().as_u16(), detail))
        }
        Ok(Err(e)) => Err(bad(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(write: bool) -> Ticket {
        ticket_of(Uuid::nil(), Uuid::nil(), Uuid::nil(), write)
    }

    fn ticket_of(tenant: Uuid, host: Uuid, vm: Uuid, write: bool) -> Ticket {
        Ticket {
            tenant,
            vm,
            host,
            user: "aiko".into(),
            credential: Credential::Token(Uuid::nil()),
            write,
        }
    }

    #[test]
    fn a_ticket_crosses_replicas_as_it_was_authorised() {
        let t = Ticket {
            credential: Credential::Session("ab12".into()),
            ..ticket(true)
        };
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Ticket>(&json).unwrap(), t);
        assert_eq!(digest("kumoc_x").len(), 64);
        assert_ne!(digest("kumoc_x"), digest("kumoc_y"));
    }

    #[test]
    fn the_replica_key_is_made_once_private_and_compared_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("kumo-replica-key-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("replica.key");
        let k = ReplicaKey::load_or_make(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = ReplicaKey::load_or_make(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(k.verify(&text) && again.verify(&text));
        assert!(!k.verify(&text[..63]));
        assert!(!k.verify(""));
        assert!(!format!("{k:?}").contains(&text[..16]), "never printed");
        std::fs::write(&path, "short").unwrap();
        assert!(ReplicaKey::load_or_make(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_link_keeps_the_last_mebibyte_for_later_attachers() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let hub = Arc::new(ConsoleHub::default());
            let (_in_tx, _in_rx) = mpsc::channel(1);
            let (_out_tx, out_rx) = mpsc::channel(1);
            let link = hub.connect(
                Uuid::new_v4(),
                AgentEnds {
                    output: out_rx,
                    input: _in_tx,
                },
            );
            let chunk = vec![b'a'; SCROLLBACK / 2 + 1];
            link.relay(FromAgent::Output(Bytes::from(chunk.clone())));
            link.relay(FromAgent::Live);
            link.relay(FromAgent::Output(Bytes::from(vec![
                b'b';
                SCROLLBACK / 2 + 1
            ])));
            let p = hub.attach(&link, hub.seat(Uuid::nil()).unwrap(), "aiko", false);
            assert_eq!(p.backlog.len(), SCROLLBACK);
            assert!(p.live);
            assert_eq!(
                p.backlog.iter().filter(|b| **b == b'a').count(),
                SCROLLBACK / 2 - 1,
                "the oldest bytes went"
            );
            assert_eq!(p.backlog.last(), Some(&b'b'));
        });
    }

    #[test]
    fn a_tenant_has_few_consoles_open_and_others_theirs() {
        let hub = ConsoleHub::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut seats: Vec<Seat> = (0..MAX_OPEN).map(|_| hub.seat(a).unwrap()).collect();
        assert!(hub.seat(a).is_err(), "capped");
        let _other = hub.seat(b).expect("another tenant's own");
        seats.pop();
        hub.seat(a).expect("room once one closed");
    }

    #[tokio::test]
    async fn only_the_host_asked_answers_a_dial_and_once() {
        let hub = Arc::new(ConsoleHub::default());
        let (host, other, vm) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let (session, rx) = hub.dial(&ticket_of(Uuid::nil(), host, vm, true));
        assert!(hub.waits_for(session));
        assert!(!hub.waits_for(Uuid::new_v4()));
        assert!(hub.answer(other, session).is_none(), "another host");
        assert!(
            hub.answer(host, Uuid::new_v4()).is_none(),
            "a session never given"
        );
        let (to_hub, mut from_hub) = hub.answer(host, session).unwrap();
        assert!(hub.answer(host, session).is_none(), "once");
        let link = hub.connect(vm, rx.await.unwrap());
        let out = |b: &'static [u8]| FromAgent::Output(Bytes::from_static(b));
        let input = |b: &'static [u8]| ToAgent::Input(Bytes::from_static(b));

        let mut a = hub.attach(&link, hub.seat(Uuid::nil()).unwrap(), "aiko", true);
        assert!(a.backlog.is_empty() && !a.live);
        to_hub.send(out(b"[boot] ")).await.unwrap();
        to_hub.send(FromAgent::Live).await.unwrap();
        assert_eq!(a.output.recv().await.unwrap(), out(b"[boot] "));
        assert_eq!(a.output.recv().await.unwrap(), FromAgent::Live);
        // Whoever comes later gets what came before as its backlog.
        let mut viewer = hub.attach(&link, hub.seat(Uuid::nil()).unwrap(), "ben", false);
        assert_eq!(viewer.backlog, b"[boot] ");
        assert!(viewer.live);
        to_hub.send(out(b"login: ")).await.unwrap();
        assert_eq!(a.output.recv().await.unwrap(), out(b"login: "));
        assert_eq!(viewer.output.recv().await.unwrap(), out(b"login: "));
        assert!(!link.write(viewer.id, input(b"x")).await, "a viewer");
        assert!(link.write(a.id, input(b"root\n")).await);
        assert_eq!(from_hub.recv().await.unwrap(), input(b"root\n"));

        // A second writer takes over; the first is told and writes no more.
        let b = hub.attach(&link, hub.seat(Uuid::nil()).unwrap(), "carol", true);
        assert_eq!(b.took_over_from.as_deref(), Some("aiko"));
        a.demoted.changed().await.unwrap();
        assert_eq!(a.demoted.borrow().as_deref(), Some("carol"));
        assert!(!link.write(a.id, input(b"x")).await);
        assert_eq!(link.writer().as_deref(), Some("carol"));

        // The agent's side ends: everyone sees the console close.
        drop(to_hub);
        a.closed.changed().await.unwrap();
        assert!(*a.closed.borrow());
        assert!(hub.link(vm).is_none());
    }
}
