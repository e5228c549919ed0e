//! Serial consoles: a person's ticket (access, audit), attaching them to
//! the VM's console (dialling its agent when no one is on it yet), the
//! agent's answer, and what its holder may still do (a console ends with
//! the credential it was opened with, and with its holder's membership; it
//! turns read-only when their role no longer allows writing). The relay itself is
//! [`crate::consoles`].

use std::time::Duration;

use kumo_api_types::{ConsoleMode, ConsoleTicket, Role, VmState};
use sea_orm::{ConnectionTrait, EntityTrait, TransactionTrait};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::app::access::{stored_role, tenant_access, Access};
use crate::app::{audit, auth};
use crate::consoles::{
    Attached, Credential, FromAgent, Ticket, ToAgent, MAX_OPEN, MAX_WAITING, TICKET_TTL,
};
use crate::context::{Actor, AppState};
use crate::entity::{api_tokens, hosts, memberships, sessions, users};
use crate::error::ApiError;
use crate::store::vms::{find_vm, stored_state};

/// How long the VM's agent has to dial once asked.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(20);

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
    let writer = st.consoles.link(vm.id).and_then(|l| l.writer());
    let action = match (write, &writer) {
        (true, Some(_)) => "vm.console.takeover",
        (true, None) => "vm.console.write",
        (false, _) => "vm.console.read",
    };
    // A prefixed secret like every other Kumo mints: recognised wherever it
    // must not be kept (an idempotent replay's stored answer among them).
    let secret = auth::mint_prefixed(auth::CONSOLE_PREFIX, Uuid::new_v4()).token;
    let ticket = Ticket::new(
        tenant.id,
        vm.id,
        host,
        actor.caller.user.name.clone(),
        credential,
        write,
    );
    st.consoles.keep(&secret, ticket).map_err(|_| {
        ApiError::Conflict(format!(
            "tenant {:?} has {MAX_WAITING} console sessions waiting to be opened; open them or let them expire (60 s)",
            tenant.name
        ))
    })?;
    let txn = st.db.begin().await?;
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

/// Opens a ticket: attaches its holder to the VM's console, asking the
/// VM's agent to dial when no one is on it. 404 for a ticket that is
/// unknown, used or expired; 401 when its credential ended meanwhile;
/// 503 when the agent does not dial within [`DIAL_TIMEOUT`].
pub async fn attach(st: &AppState, secret: &str) -> Result<(Ticket, Attached), ApiError> {
    let t = st
        .consoles
        .redeem(secret)
        .ok_or_else(|| ApiError::not_found("console session (tickets open once, within 60 s)"))?;
    // The ticket's holder is checked again: their credential, membership
    // or role may have changed in the ticket's minute.
    let mut t = t;
    match standing(&st.db, &t.credential, t.tenant, st.config.clock.now()).await? {
        Standing::Ended(why) => {
            return Err(ApiError::Unauthenticated(format!(
                "this console can no longer be opened: {why}"
            )))
        }
        Standing::Watch => t.write = false,
        Standing::Write => {}
    }
    let seat = st.consoles.seat(t.tenant).map_err(|_| {
        ApiError::Conflict(format!(
            "this project has {MAX_OPEN} consoles open; close one first"
        ))
    })?;
    let link = match st.consoles.link(t.vm) {
        Some(l) => l,
        None => {
            let (session, answered) = st.consoles.dial(&t);
            let txn = st.db.begin().await?;
            crate::store::hosts::bump_revision(&txn, t.host).await?;
            txn.commit().await?;
            st.signals.notify(t.host);
            let ends = tokio::time::timeout(DIAL_TIMEOUT, answered)
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or_else(|| {
                    tracing::warn!(vm = %t.vm, %session, "the VM's agent did not dial for its console");
                    ApiError::Unreachable("the VM's host did not connect its console; try again".into())
                })?;
            st.consoles.connect(t.vm, ends)
        }
    };
    let attached = st.consoles.attach(&link, seat, &t.user, t.write);
    Ok((t, attached))
}

/// The agent of `host` dials `session`: the channels its websocket is
/// pumped through (to the people, from the writer). 404 for a session
/// this host was not asked to dial (or already answered).
pub fn answer(
    st: &AppState,
    host: &hosts::Model,
    session: Uuid,
) -> Result<(mpsc::Sender<FromAgent>, mpsc::Receiver<ToAgent>), ApiError> {
    st.consoles.answer(host.id, session).ok_or_else(|| {
        tracing::warn!(host = %host.name, %session, "an agent dialled a console session it was not given");
        ApiError::not_found("console session")
    })
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
