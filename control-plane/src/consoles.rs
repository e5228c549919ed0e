//! The relay between people and VMs' serial consoles, in memory.
//!
//! Agents stay outbound-only: a console is reached by asking the VM's
//! agent (through its desired state) to dial the server with a one-time
//! session id; the hub hands the agent's byte channels to a [`Link`], one
//! per VM, which fans the console's output out to every attached person
//! and takes input from one writer at a time. A person attaches with a
//! one-time ticket, minted by an authenticated request, valid
//! [`TICKET_TTL`]; only its SHA-256 is kept. A tenant has at most
//! [`MAX_WAITING`] tickets and dials waiting at once: they are this
//! process's memory, and each dial wakes an agent.
//!
//! A link lives in the server that the agent dialled: tickets, dials and
//! links are this process's, so a console needs the person's websocket
//! and the agent's on the same replica (one server, or sticky routing).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kumo_api_types::ConsoleControl;
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

/// A tenant has [`MAX_WAITING`] tickets and dials waiting already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyWaiting;

/// What a person's session was opened with, to end it with that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// An API token (its id).
    Token(Uuid),
    /// A portal session (its id: the SHA-256 of the cookie's secret).
    Session(String),
}

/// An authorised, not yet opened, console session.
#[derive(Debug, Clone)]
pub struct Ticket {
    pub tenant: Uuid,
    pub vm: Uuid,
    pub host: Uuid,
    pub user: String,
    pub credential: Credential,
    pub write: bool,
    expires: Instant,
}

impl Ticket {
    pub fn new(
        tenant: Uuid,
        vm: Uuid,
        host: Uuid,
        user: String,
        credential: Credential,
        write: bool,
    ) -> Ticket {
        Ticket {
            tenant,
            vm,
            host,
            user,
            credential,
            write,
            expires: Instant::now() + TICKET_TTL,
        }
    }
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
    tenant: Uuid,
    host: Uuid,
    vm: Uuid,
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

    /// `id` leaves: the console has no writer if it was.
    pub fn leave(&self, id: u64) {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if w.as_ref().is_some_and(|w| w.id == id) {
            *w = None;
        }
    }
}

/// Every console this server relays.
#[derive(Default)]
pub struct ConsoleHub {
    tickets: Mutex<HashMap<String, Ticket>>,
    dials: Mutex<HashMap<Uuid, Dial>>,
    links: Mutex<HashMap<Uuid, Arc<Link>>>,
    next: AtomicU64,
    /// Set when the server shuts down: every console's relays end (an
    /// upgraded connection outlives the server's graceful shutdown).
    closing: watch::Sender<bool>,
    /// Open consoles by tenant.
    open: Arc<Mutex<HashMap<Uuid, usize>>>,
}

/// One of a tenant's [`MAX_OPEN`] open consoles, given back when dropped.
pub struct Seat {
    open: Arc<Mutex<HashMap<Uuid, usize>>>,
    tenant: Uuid,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

impl ConsoleHub {
    /// Keeps a ticket under its secret's SHA-256 (the secret itself, a
    /// prefixed secret the caller minted, is not kept). Refused when its
    /// tenant has [`MAX_WAITING`] tickets and dials waiting already.
    pub fn keep(&self, secret: &str, ticket: Ticket) -> Result<(), TooManyWaiting> {
        let now = Instant::now();
        let mut t = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|_, t| t.expires > now);
        let dials = {
            let mut d = self.dials.lock().unwrap_or_else(|e| e.into_inner());
            d.retain(|_, d| d.expires > now && !d.tx.is_closed());
            d.values().filter(|d| d.tenant == ticket.tenant).count()
        };
        let tickets = t.values().filter(|x| x.tenant == ticket.tenant).count();
        if tickets + dials >= MAX_WAITING {
            return Err(TooManyWaiting);
        }
        t.insert(sha256_hex(secret), ticket);
        Ok(())
    }

    /// Takes a ticket by its secret: once, before it expires.
    pub fn redeem(&self, secret: &str) -> Option<Ticket> {
        let t = self
            .tickets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&sha256_hex(secret))?;
        (t.expires > Instant::now()).then_some(t)
    }

    /// The live console of a VM, if any.
    pub fn link(&self, vm: Uuid) -> Option<Arc<Link>> {
        let links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        links.get(&vm).filter(|l| !*l.closed.borrow()).cloned()
    }

    /// Asks for a VM's agent to dial: answers the session id to list in
    /// its host's desired state and what the dial will bring.
    pub fn dial(&self, t: &Ticket) -> (Uuid, oneshot::Receiver<AgentEnds>) {
        let (tenant, host, vm) = (t.tenant, t.host, t.vm);
        let session = Uuid::new_v4();
        let (tx, rx) = oneshot::channel();
        let mut d = self.dials.lock().unwrap_or_else(|e| e.into_inner());
        d.retain(|_, d| d.expires > Instant::now() && !d.tx.is_closed());
        d.insert(
            session,
            Dial {
                tenant,
                host,
                vm,
                expires: Instant::now() + TICKET_TTL,
                tx,
            },
        );
        (session, rx)
    }

    /// The dials a host's agent should make: `(session, vm)`.
    pub fn dials_for(&self, host: Uuid) -> Vec<(Uuid, Uuid)> {
        let d = self.dials.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(Uuid, Uuid)> = d
            .iter()
            .filter(|(_, d)| d.host == host && d.expires > Instant::now() && !d.tx.is_closed())
            .map(|(s, d)| (*s, d.vm))
            .collect();
        out.sort();
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(write: bool) -> Ticket {
        ticket_of(Uuid::nil(), Uuid::nil(), Uuid::nil(), write)
    }

    fn ticket_of(tenant: Uuid, host: Uuid, vm: Uuid, write: bool) -> Ticket {
        Ticket::new(
            tenant,
            vm,
            host,
            "aiko".into(),
            Credential::Token(Uuid::nil()),
            write,
        )
    }

    #[test]
    fn a_ticket_opens_once() {
        let hub = ConsoleHub::default();
        let secret = "kumoc_0123_secret";
        hub.keep(secret, ticket(true)).unwrap();
        assert!(hub.redeem("kumoc_0123_other").is_none());
        assert!(hub.redeem(secret).is_some());
        assert!(hub.redeem(secret).is_none(), "one-time");
    }

    #[test]
    fn a_tenant_has_few_tickets_and_dials_waiting_and_others_theirs() {
        let hub = ConsoleHub::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let t = ticket_of(a, Uuid::nil(), Uuid::nil(), false);
        let (_, _waiting) = hub.dial(&t);
        for i in 1..MAX_WAITING {
            hub.keep(&format!("a{i}"), t.clone()).unwrap();
        }
        assert!(
            hub.keep("a-more", t.clone()).is_err(),
            "tickets and dials count"
        );
        hub.keep("b1", ticket_of(b, Uuid::nil(), Uuid::nil(), false))
            .expect("another tenant's own");
        assert!(hub.redeem("a1").is_some());
        hub.keep("a-again", t).expect("room once one is opened");
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
        assert_eq!(hub.dials_for(host), vec![(session, vm)]);
        assert!(hub.dials_for(other).is_empty());
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
