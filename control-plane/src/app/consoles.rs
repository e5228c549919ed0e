//! Serial consoles: a person's ticket (access, audit), attaching them to
//! the VM's console (dialling its agent when no one is on it yet), the
//! agent's answer, and what its holder may still do (a console ends with
//! the credential it was opened with, and with its holder's membership; it
//! turns read-only when their role no longer allows writing). The relay itself is
//! [`crate::consoles`].
//!
//! Across replicas: tickets, dials, each VM's link's home and open
//! consoles are rows, so any replica opens a ticket, lists a dial in its
//! host's desired state and counts a tenant's consoles; a person or an
//! agent that reaches another replica than the link's home is relayed to
//! it ([`Opened::Relayed`], [`Answered::Relayed`]).

use std::time::Duration;

use base64::Engine;
use chrono::{DateTime, Utc};
use kumo_api_types::{ConsoleMode, ConsoleTicket, Role, VmState};
use sea_orm::{ActiveValue::Set, ConnectionTrait, EntityTrait, QuerySelect, TransactionTrait};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::app::access::{stored_role, tenant_access, Access};
use crate::app::{audit, auth};
use crate::consoles::{
    Attached, Credential, FromAgent, RelayError, ReplicaKey, Ticket, ToAgent, Upstream, MAX_OPEN,
    MAX_WAITING, TICKET_TTL,
};
use crate::context::{Actor, AppState};
use crate::entity::{api_tokens, console_dials, console_tickets, hosts, memberships, sessions};
use crate::entity::{tenants, users};
use crate::error::ApiError;
use crate::store::consoles as store;
use crate::store::vms::{find_vm, stored_state};

/// How long the VM's agent has to dial once asked.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(20);

/// How often a replica says it is alive.
pub const BEAT: Duration = Duration::from_secs(5);

/// A replica not seen for this long is gone: the links it held are
/// claimed afresh, its consoles no longer count.
pub const STALE: Duration = Duration::from_secs(20);

/// What a gone replica left behind is swept after this long.
const SWEEP_AFTER: Duration = Duration::from_secs(600);

fn wall(st: &AppState) -> DateTime<Utc> {
    st.config.clock.now()
}

fn ago(st: &AppState, d: Duration) -> DateTime<Utc> {
    wall(st) - chrono::Duration::from_std(d).unwrap_or_default()
}

fn later(st: &AppState, d: Duration) -> DateTime<Utc> {
    wall(st) + chrono::Duration::from_std(d).unwrap_or_default()
}

/// Makes this replica known: its address and the replicas' key (read or
/// made), recorded in the database before it serves.
pub async fn register(st: &AppState, bound: std::net::SocketAddr) -> Result<(), ApiError> {
    let path = st.config.replicas.key_path(&st.config.data_dir);
    let key = ReplicaKey::load_or_make(&path).map_err(ApiError::Internal)?;
    let url = st.config.replicas.url_for(bound);
    tracing::info!(replica = %st.consoles.replica(), %url, "console relays reach this replica here");
    st.consoles.identify(url, key);
    beat(st, true).await
}

/// This replica is alive (every [`BEAT`]); with `sweep`, what gone
/// replicas and expired tickets and dials left goes too.
pub async fn beat(st: &AppState, sweep: bool) -> Result<(), ApiError> {
    let Some(url) = st.consoles.url() else {
        return Ok(());
    };
    store::beat(&st.db, st.consoles.replica(), url, wall(st)).await?;
    if sweep {
        store::sweep(&st.db, wall(st), ago(st, SWEEP_AFTER)).await?;
    }
    Ok(())
}

/// This replica stops: its links, seats and dials go with it, so the
/// others claim its VMs' consoles at once.
pub async fn retire(st: &AppState) -> Result<(), ApiError> {
    store::forget(&st.db, &[st.consoles.replica()]).await?;
    Ok(())
}

/// Locks the tenant's row until the transaction ends (PostgreSQL;
/// SQLite's one writer serialises anyway): two replicas counting a
/// tenant's waiting or open consoles at once cannot both pass the limit.
/// Taken after the transaction's first write, and the count after it: on
/// SQLite shared by two replicas a transaction that reads first cannot
/// write once the other replica wrote.
async fn lock_tenant(txn: &impl ConnectionTrait, tenant: Uuid) -> Result<(), ApiError> {
    tenants::Entity::find_by_id(tenant)
        .lock_exclusive()
        .one(txn)
        .await?;
    Ok(())
}

/// Authorises a console session on a tenant's VM: writing for members,
/// watching for viewers too. The VM must be running. Answers the ticket
/// (its secret in the URL, valid [`TICKET_TTL`], once).
pub async fn authorize(
    st: &AppState,
    actor: &Actor,
    credential: Credential,
    tenant: &str,
    vm: &str,
    mode: ConsoleMode,
) -> Result<ConsoleTicket, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let write = mode == ConsoleMode::Write;
    if write {
        access.require(Role::Member, "writing on a VM's console")?;
    } else {
        access.require(Role::Viewer, "watching a VM's console")?;
    }
    let vm = find_vm(&st.db, &tenant, vm).await?;
    let state = stored_state(&vm)?;
    let host = vm
        .host_id
        .filter(|_| matches!(state, VmState::Running | VmState::Preempting))
        .ok_or_else(|| {
            ApiError::Conflict(format!(
                "VM {:?} is {}: its console is there while it runs",
                vm.name,
                state.as_str()
            ))
        })?;
    // Known where the VM's console lives; at another replica it is told
    // on the console itself when the new writer takes over.
    let writer = st.consoles.link(vm.id).and_then(|l| l.writer());
    let action = match (write, &writer) {
        (true, Some(_)) => "vm.console.takeover",
        (true, None) => "vm.console.write",
        (false, _) => "vm.console.read",
    };
    // A prefixed secret like every other Kumo mints: recognised wherever it
    // must not be kept (an idempotent replay's stored answer among them).
    let secret = auth::mint_prefixed(auth::CONSOLE_PREFIX, Uuid::new_v4()).token;
    let (token_id, session_id) = match &credential {
        Credential::Token(t) => (Some(*t), None),
        Credential::Session(s) => (None, Some(s.clone())),
    };
    let txn = st.db.begin().await?;
    store::insert_ticket(
        &txn,
        console_tickets::ActiveModel {
            digest: Set(crate::consoles::digest(&secret)),
            tenant_id: Set(tenant.id),
            vm_id: Set(vm.id),
            host_id: Set(host),
            user_name: Set(actor.caller.user.name.clone()),
            token_id: Set(token_id),
            session_id: Set(session_id),
            write: Set(write),
            expires_at: Set(later(st, TICKET_TTL)),
        },
    )
    .await?;
    lock_tenant(&txn, tenant.id).await?;
    if store::waiting(&txn, tenant.id, wall(st)).await? > MAX_WAITING as u64 {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} has {MAX_WAITING} console sessions waiting to be opened; open them or let them expire (60 s)",
            tenant.name
        )));
    }
    audit::record(&txn, actor, action, Some(&tenant), &vm.name).await?;
    txn.commit().await?;
    Ok(ConsoleTicket {
        url: format!("/api/v1/consoles/{secret}"),
        ticket: secret,
        expires_at: actor.at + chrono::Duration::seconds(TICKET_TTL.as_secs() as i64),
        write,
        writer,
    })
}

/// A ticket opened: attached here, or relayed to the replica holding the
/// VM's console (which attached its holder and runs their console).
pub enum Opened {
    Here(Ticket, Box<Attached>),
    Relayed(Box<Upstream>),
}

/// Where a VM's console is to be held.
enum Home {
    Here,
    At(String),
}

/// The home of a VM's console: the replica recorded for it while alive,
/// else this one (recorded so).
async fn home_of(st: &AppState, vm: Uuid) -> Result<Home, ApiError> {
    let me = st.consoles.replica();
    for _ in 0..3 {
        let claimed = match store::link(&st.db, vm).await? {
            None => store::claim_link(&st.db, vm, me, None, wall(st)).await?,
            Some(l) if l.replica_id == me => return Ok(Home::Here),
            Some(l) => match store::live_replica(&st.db, l.replica_id, ago(st, STALE)).await? {
                Some(r) => return Ok(Home::At(r.url)),
                // Its replica is gone: the console starts afresh here.
                None => store::claim_link(&st.db, vm, me, Some(l.replica_id), wall(st)).await?,
            },
        };
        if claimed {
            return Ok(Home::Here);
        }
        // Another replica claimed it meanwhile: read whose it is.
    }
    Err(ApiError::Contention)
}

/// The problem another replica answered, as this replica's.
fn relayed_problem(e: RelayError) -> ApiError {
    match e {
        RelayError::Refused(401, d) => {
            ApiError::Unauthenticated(d.trim_start_matches("authentication required: ").to_owned())
        }
        RelayError::Refused(404, _) => {
            ApiError::not_found("console session (tickets open once, within 60 s)")
        }
        RelayError::Refused(409, d) => ApiError::Conflict(d),
        RelayError::Refused(status, d) => {
            tracing::warn!(status, detail = %d, "a replica refused a relayed console");
            ApiError::Unreachable(format!("the console could not be opened: {d}"))
        }
        RelayError::Unreachable(why) => {
            tracing::warn!(error = %why, "the replica holding a console is unreachable");
            ApiError::Unreachable(
                "the server holding this VM's console did not answer; try again".into(),
            )
        }
    }
}

fn key(st: &AppState) -> Result<&ReplicaKey, ApiError> {
    st.consoles
        .key()
        .ok_or_else(|| ApiError::Internal("this replica has no key yet".into()))
}

/// Opens a ticket: attaches its holder to the VM's console here, or
/// relays them to the replica that holds it. 404 for a ticket that is
/// unknown, used or expired; 401 when its credential ended meanwhile;
/// 503 when the agent does not dial within [`DIAL_TIMEOUT`].
pub async fn attach(st: &AppState, secret: &str) -> Result<Opened, ApiError> {
    let t = store::take_ticket(&st.db, &crate::consoles::digest(secret), wall(st))
        .await?
        .ok_or_else(|| ApiError::not_found("console session (tickets open once, within 60 s)"))?;
    let credential = match (t.token_id, t.session_id) {
        (Some(id), _) => Credential::Token(id),
        (None, Some(s)) => Credential::Session(s),
        (None, None) => {
            return Err(ApiError::Internal(
                "a console ticket without its credential".into(),
            ))
        }
    };
    let t = Ticket {
        tenant: t.tenant_id,
        vm: t.vm_id,
        host: t.host_id,
        user: t.user_name,
        credential,
        write: t.write,
    };
    if st.consoles.link(t.vm).is_some() {
        return attach_here(st, t).await;
    }
    match home_of(st, t.vm).await? {
        Home::Here => attach_here(st, t).await,
        Home::At(url) => {
            let json = serde_json::to_vec(&t).map_err(|e| ApiError::Internal(e.to_string()))?;
            let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
            let up = crate::consoles::relay(
                &url,
                "/internal/v1/consoles/attach",
                key(st)?,
                &[(crate::consoles::TICKET_HEADER, header)],
            )
            .await
            .map_err(relayed_problem)?;
            st.metrics.console_relayed(false);
            Ok(Opened::Relayed(Box::new(up)))
        }
    }
}

/// A replica relays a person to this one: their ticket, authorised
/// there, as its header carries it.
pub async fn attach_relayed(st: &AppState, ticket: &str) -> Result<Opened, ApiError> {
    let t: Ticket = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(ticket)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| ApiError::Validation {
            detail: "the relayed console ticket does not read".into(),
            errors: Vec::new(),
        })?;
    attach_here(st, t).await
}

/// Attaches a ticket's holder to the VM's console on this replica,
/// asking the VM's agent to dial when no one is on it. The holder's
/// standing is read again: their credential, membership or role may have
/// changed since the ticket.
async fn attach_here(st: &AppState, mut t: Ticket) -> Result<Opened, ApiError> {
    match standing(&st.db, &t.credential, t.tenant, st.config.clock.now()).await? {
        Standing::Ended(why) => {
            return Err(ApiError::Unauthenticated(format!(
                "this console can no longer be opened: {why}"
            )))
        }
        Standing::Watch => t.write = false,
        Standing::Write => {}
    }
    let full = || {
        ApiError::Conflict(format!(
            "this project has {MAX_OPEN} consoles open; close one first"
        ))
    };
    let mut seat = st.consoles.seat(t.tenant).map_err(|_| full())?;
    // The tenant's consoles on every live replica count.
    let id = Uuid::new_v4();
    let me = st.consoles.replica();
    let txn = st.db.begin().await?;
    store::insert_seat(&txn, id, t.tenant, me, wall(st)).await?;
    lock_tenant(&txn, t.tenant).await?;
    let live = store::live_replicas(&txn, ago(st, STALE)).await?;
    if store::seats(&txn, t.tenant, &live).await? > MAX_OPEN as u64 {
        return Err(full());
    }
    txn.commit().await?;
    let db = st.db.clone();
    seat.on_release(move || {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = store::delete_seat(&db, id).await {
                    tracing::warn!(error = %e, "a closed console's seat stays until its replica goes");
                }
            });
        }
    });
    let link = match st.consoles.link(t.vm) {
        Some(l) => l,
        None => {
            let ends = dial(st, &t).await?;
            let link = st.consoles.connect(t.vm, ends);
            // The link ends with the agent's side: the VM's console has
            // no home until the next person opens it.
            let (db, mut closed, vm) = (st.db.clone(), link.closed(), t.vm);
            tokio::spawn(async move {
                let _ = closed.wait_for(|c| *c).await;
                if let Err(e) = store::release_link(&db, vm, me).await {
                    tracing::warn!(error = %e, %vm, "a console's home stays until its replica goes");
                }
            });
            link
        }
    };
    let attached = st.consoles.attach(&link, seat, &t.user, t.write);
    Ok(Opened::Here(t, Box::new(attached)))
}

/// Asks the VM's agent to dial this replica (its dial listed in the
/// host's desired state on every replica) and waits for it.
async fn dial(st: &AppState, t: &Ticket) -> Result<crate::consoles::AgentEnds, ApiError> {
    let me = st.consoles.replica();
    // This replica holds the VM's console (it may have come here relayed,
    // or the row may have gone with a link that just ended).
    if !store::claim_link(&st.db, t.vm, me, None, wall(st)).await? {
        if let Some(l) = store::link(&st.db, t.vm).await? {
            if l.replica_id != me {
                store::claim_link(&st.db, t.vm, me, Some(l.replica_id), wall(st)).await?;
            }
        }
    }
    let (session, answered) = st.consoles.dial(t);
    let txn = st.db.begin().await?;
    store::insert_dial(
        &txn,
        console_dials::ActiveModel {
            session: Set(session),
            tenant_id: Set(t.tenant),
            vm_id: Set(t.vm),
            host_id: Set(t.host),
            replica_id: Set(me),
            expires_at: Set(later(st, DIAL_TIMEOUT)),
        },
    )
    .await?;
    // In the same transaction: a replica that sees the revision move
    // sees the dial.
    crate::store::hosts::bump_revision(&txn, t.host).await?;
    txn.commit().await?;
    st.signals.notify(t.host);
    let ends = tokio::time::timeout(DIAL_TIMEOUT, answered)
        .await
        .ok()
        .and_then(Result::ok);
    let Some(ends) = ends else {
        tracing::warn!(vm = %t.vm, %session, "the VM's agent did not dial for its console");
        let _ = store::delete_dial(&st.db, session).await;
        if st.consoles.link(t.vm).is_none() {
            let _ = store::release_link(&st.db, t.vm, me).await;
        }
        return Err(ApiError::Unreachable(
            "the VM's host did not connect its console; try again".into(),
        ));
    };
    Ok(ends)
}

/// The dials a host's agent should make, whichever replica the persons
/// wait at: `(session, vm)`.
pub async fn dials_for(st: &AppState, host: Uuid) -> Result<Vec<(Uuid, Uuid)>, ApiError> {
    Ok(store::dials_for(&st.db, host, wall(st)).await?)
}

/// An agent's dial answered: here, the channels its websocket is pumped
/// through (to the people, from the writer); or relayed to the replica
/// the person waits at.
pub enum Answered {
    Here(mpsc::Sender<FromAgent>, mpsc::Receiver<ToAgent>),
    Relayed(Box<Upstream>),
}

/// The agent of `host` dials `session`. 404 for a session this host was
/// not asked to dial (or already answered).
pub async fn answer(
    st: &AppState,
    host: &hosts::Model,
    session: Uuid,
) -> Result<Answered, ApiError> {
    let unknown = || {
        tracing::warn!(host = %host.name, %session, "an agent dialled a console session it was not given");
        ApiError::not_found("console session")
    };
    if st.consoles.waits_for(session) {
        return answer_here(st, host.id, session).await;
    }
    let Some(d) = store::dial(&st.db, session, wall(st)).await? else {
        return Err(unknown());
    };
    if d.host_id != host.id || d.replica_id == st.consoles.replica() {
        return Err(unknown());
    }
    let Some(r) = store::live_replica(&st.db, d.replica_id, ago(st, STALE)).await? else {
        return Err(unknown());
    };
    let up = crate::consoles::relay(
        &r.url,
        &format!("/internal/v1/consoles/dial/{session}"),
        key(st)?,
        &[(crate::consoles::HOST_HEADER, host.id.to_string())],
    )
    .await
    .map_err(relayed_problem)?;
    st.metrics.console_relayed(true);
    Ok(Answered::Relayed(Box::new(up)))
}

/// The dial of `session` by `host`'s agent, here (where the person
/// waits): its row goes.
pub async fn answer_here(st: &AppState, host: Uuid, session: Uuid) -> Result<Answered, ApiError> {
    let (tx, rx) = st.consoles.answer(host, session).ok_or_else(|| {
        tracing::warn!(%host, %session, "a console session was dialled that no one here waits for");
        ApiError::not_found("console session")
    })?;
    store::delete_dial(&st.db, session).await?;
    Ok(Answered::Here(tx, rx))
}

/// A request from another replica: it shows the replicas' key.
pub fn replica_caller(st: &AppState, presented: Option<&str>) -> Result<(), ApiError> {
    let ok = match (st.consoles.key(), presented) {
        (Some(k), Some(p)) => k.verify(p),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        tracing::warn!("a request to the replicas' console relay without their key");
        Err(ApiError::Unauthenticated(
            "only Kumo's own replicas relay consoles".into(),
        ))
    }
}

/// What a console's holder may do on it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// The console must close, and why.
    Ended(&'static str),
    /// Watch only: a viewer (or a writer demoted to one).
    Watch,
    /// Type and send controls.
    Write,
}

/// The standing of a console's holder now: the token or portal session
/// it was opened with still holds (not revoked, expired or signed out; its
/// user not disabled), and the user is still an admin or a member of the
/// console's tenant, with the role that writing needs. A console in use is
/// use of its session: only the session's absolute lifetime ends it, not
/// its idle limit. Re-read on every check, so a removal or demotion acts
/// on consoles opened before it.
pub async fn standing(
    db: &impl ConnectionTrait,
    credential: &Credential,
    tenant: Uuid,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Standing, ApiError> {
    const ENDED: Standing = Standing::Ended("your session or token ended");
    let token_alive =
        |t: &api_tokens::Model| t.revoked_at.is_none() && t.expires_at.is_none_or(|e| e > now);
    let (user, token) = match credential {
        Credential::Token(id) => {
            let Some(t) = api_tokens::Entity::find_by_id(*id).one(db).await? else {
                return Ok(ENDED);
            };
            (t.user_id, Some(t))
        }
        Credential::Session(id) => {
            let Some(s) = sessions::Entity::find_by_id(id.clone()).one(db).await? else {
                return Ok(ENDED);
            };
            if crate::domain::sessions::outlived(s.created_at, now) {
                return Ok(ENDED);
            }
            let token = match s.token_id {
                Some(t) => match api_tokens::Entity::find_by_id(t).one(db).await? {
                    Some(t) => Some(t),
                    None => return Ok(ENDED),
                },
                None => None,
            };
            (s.user_id, token)
        }
    };
    if token.as_ref().is_some_and(|t| !token_alive(t)) {
        return Ok(ENDED);
    }
    let Some(user) = users::Entity::find_by_id(user).one(db).await? else {
        return Ok(ENDED);
    };
    if user.disabled {
        return Ok(ENDED);
    }
    let access = if user.is_admin {
        Access::Admin
    } else {
        match memberships::Entity::find_by_id((tenant, user.id))
            .one(db)
            .await?
        {
            Some(m) => Access::Member(stored_role(&m.role)?),
            None => {
                return Ok(Standing::Ended(
                    "you are no longer a member of this project",
                ))
            }
        }
    };
    Ok(if access.allows(Role::Member) {
        Standing::Write
    } else if access.allows(Role::Viewer) {
        Standing::Watch
    } else {
        Standing::Ended("your role in this project no longer allows its consoles")
    })
}
