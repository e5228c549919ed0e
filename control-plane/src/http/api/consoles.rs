//! Serial consoles over websockets: the ticket (an authenticated
//! request), the person's websocket (the ticket is its credential:
//! browsers cannot set headers on one), and the agent's dial.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use kumo_api_types::{ConsoleControl, ConsoleEvent, ConsoleParams, ConsoleTicket};
use uuid::Uuid;

use super::agent::HostCaller;
use super::Problems;
use crate::app::consoles::Standing;
use crate::consoles::{Attached, Credential, FromAgent, Ticket, ToAgent};
use crate::context::{Actor, AppState};
use crate::error::ApiError;
use crate::http::extract::{Path, Query};

/// A console closes after this long without a keystroke or output.
const IDLE: Duration = Duration::from_secs(30 * 60);

/// Open a VM's serial console: answers a one-time websocket URL, valid
/// 60 s. `mode=write` (members; default) types into it, taking it over
/// from whoever wrote before (they are told); `mode=read` watches it
/// (viewers too). The VM must be running.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/vms/{vm}/console", tag = "vms",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("vm" = String, Path, description = "VM name or id"),
        ConsoleParams,
        ("Idempotency-Key" = Option<String>, Header, description = "A retry gets 409: the ticket is shown once and not kept"),
    ),
    responses((status = 201, description = "Open `url` as a websocket within 60 s", body = ConsoleTicket), Problems)
)]
pub async fn open(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
    Query(q): Query<ConsoleParams>,
) -> Result<(StatusCode, axum::Json<ConsoleTicket>), ApiError> {
    let credential = Credential::Token(ctx.caller.token_id);
    let t = crate::app::consoles::authorize(
        &st,
        &ctx,
        credential,
        &tenant,
        &vm,
        q.mode.unwrap_or_default(),
    )
    .await?;
    Ok((StatusCode::CREATED, axum::Json(t)))
}

/// `GET /api/v1/consoles/{ticket}`: the person's websocket.
pub async fn person(
    State(st): State<AppState>,
    axum::extract::Path(secret): axum::extract::Path<String>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let (ticket, attached) = crate::app::consoles::attach(&st, &secret).await?;
    Ok(ws.on_upgrade(move |socket| relay_person(st, ticket, attached, socket)))
}

const RESTARTING: &str = "the server is restarting; open the console again in a moment";

/// Why a console whose agent's side ended closed: the server's shutdown
/// ends that side too.
fn ended(closing: &tokio::sync::watch::Receiver<bool>) -> &'static str {
    if *closing.borrow() {
        RESTARTING
    } else {
        "the VM's console ended"
    }
}

/// Resolves once the server shuts down.
async fn shut(closing: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = closing.wait_for(|c| *c).await;
}

fn event(e: &ConsoleEvent) -> Message {
    Message::Text(serde_json::to_string(e).unwrap_or_default().into())
}

/// Relays between a person and the console until either ends, the
/// person's credential or membership ends (checked every second; a
/// demotion to viewer makes it read-only), or nothing happens for
/// [`IDLE`].
async fn relay_person(st: AppState, mut t: Ticket, mut a: Attached, socket: WebSocket) {
    let (mut tx, mut rx) = socket.split();
    if let Some(from) = a.took_over_from.take() {
        let _ = tx.send(event(&ConsoleEvent::TookOver { from })).await;
    }
    let backlog = std::mem::take(&mut a.backlog);
    if !backlog.is_empty() {
        let _ = tx.send(Message::Binary(backlog.into())).await;
    }
    if a.live {
        let _ = tx.send(event(&ConsoleEvent::Live)).await;
    }
    let mut check = tokio::time::interval(Duration::from_secs(1));
    let mut closing = st.consoles.closing();
    let mut last = tokio::time::Instant::now();
    let why = loop {
        tokio::select! {
            out = a.output.recv() => match out {
                Ok(chunk) => {
                    last = tokio::time::Instant::now();
                    let m = match chunk {
                        FromAgent::Output(b) => Message::Binary(b),
                        FromAgent::Live => event(&ConsoleEvent::Live),
                    };
                    if tx.send(m).await.is_err() {
                        break "the connection dropped";
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break ended(&closing),
            },
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    last = tokio::time::Instant::now();
                    if t.write {
                        a.link.write(a.id, ToAgent::Input(b)).await;
                    }
                }
                Some(Ok(Message::Text(s))) => {
                    // A control (the terminal's size, Ctrl-Alt-Del); text
                    // that is none is not typed: paste goes as bytes.
                    last = tokio::time::Instant::now();
                    if let (true, Ok(c)) = (t.write, serde_json::from_str::<ConsoleControl>(s.as_str())) {
                        a.link.write(a.id, ToAgent::Control(c)).await;
                    }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                _ => break "closed",
            },
            Ok(()) = a.demoted.changed() => {
                let by = a.demoted.borrow().clone().unwrap_or_default();
                let _ = tx.send(event(&ConsoleEvent::TakenOver { by })).await;
            },
            _ = a.closed.changed() => {
                if *a.closed.borrow() {
                    break ended(&closing);
                }
            },
            () = shut(&mut closing) => break RESTARTING,
            _ = check.tick() => {
                if last.elapsed() > IDLE {
                    break "idle";
                }
                let now = st.config.clock.now();
                match crate::app::consoles::standing(&st.db, &t.credential, t.tenant, now).await {
                    Ok(Standing::Write) => {}
                    Ok(Standing::Watch) if t.write => {
                        // Demoted: the keyboard goes back, what they type
                        // from now on is dropped.
                        t.write = false;
                        a.link.leave(a.id);
                        let reason = "your role in this project is viewer now".to_owned();
                        let _ = tx.send(event(&ConsoleEvent::ReadOnly { reason })).await;
                    }
                    Ok(Standing::Watch) => {}
                    Ok(Standing::Ended(why)) => break why,
                    Err(_) => {} // the database is down: try again next tick
                }
            },
        }
    };
    a.link.leave(a.id);
    let _ = tx
        .send(event(&ConsoleEvent::Closed {
            reason: why.to_owned(),
        }))
        .await;
    let _ = tx.close().await;
}

/// `GET /agent/v1/console/{session}`: the agent's dial for a console it
/// was asked for (its host credential, a session it was given, once).
pub async fn agent(
    State(st): State<AppState>,
    HostCaller(host): HostCaller,
    axum::extract::Path(session): axum::extract::Path<Uuid>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let (to_people, mut from_writer) = crate::app::consoles::answer(&st, &host, session)?;
    let mut closing = st.consoles.closing();
    Ok(ws.on_upgrade(move |socket| async move {
        let (mut tx, mut rx) = socket.split();
        loop {
            tokio::select! {
                msg = rx.next() => match msg {
                    Some(Ok(Message::Binary(b))) => {
                        if to_people.send(FromAgent::Output(b)).await.is_err() {
                            break;
                        }
                    }
                    Some(Ok(Message::Text(s))) => {
                        if matches!(serde_json::from_str(s.as_str()), Ok(ConsoleEvent::Live))
                            && to_people.send(FromAgent::Live).await.is_err()
                        {
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    _ => break,
                },
                input = from_writer.recv() => {
                    let m = match input {
                        Some(ToAgent::Input(b)) => Message::Binary(b),
                        Some(ToAgent::Control(c)) => Message::Text(serde_json::to_string(&c).unwrap_or_default().into()),
                        None => break,
                    };
                    if tx.send(m).await.is_err() {
                        break;
                    }
                },
                _ = to_people.closed() => break,
                () = shut(&mut closing) => break,
            }
        }
        let _ = tx.close().await;
    }))
}

/// The websocket routes (outside the OpenAPI document: the person's is
/// opened from a ticket's URL, the agent's from its desired state).
pub fn sockets() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/api/v1/consoles/{ticket}", axum::routing::get(person))
        .route("/agent/v1/console/{session}", axum::routing::get(agent))
}
