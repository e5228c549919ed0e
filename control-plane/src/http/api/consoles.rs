//! Serial consoles over websockets: the ticket (an authenticated
//! request), the person's websocket (the ticket is its credential:
//! browsers cannot set headers on one), and the agent's dial; and the
//! replicas' internal endpoints, where another replica relays a person or
//! a dial to the one holding the VM's console.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use kumo_api_types::{ConsoleControl, ConsoleEvent, ConsoleParams, ConsoleTicket};
use uuid::Uuid;

use super::agent::HostCaller;
use super::Problems;
use crate::app::consoles::{Answered, Opened, Standing};
use crate::consoles::{Attached, Credential, FromAgent, Ticket, ToAgent, Upstream};
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
    let opened = crate::app::consoles::attach(&st, &secret).await?;
    Ok(upgrade_person(st, opened, ws))
}

fn upgrade_person(st: AppState, opened: Opened, ws: WebSocketUpgrade) -> Response {
    match opened {
        Opened::Here(ticket, attached) => {
            ws.on_upgrade(move |socket| relay_person(st, ticket, *attached, socket))
        }
        Opened::Relayed(up) => ws.on_upgrade(move |socket| async move {
            if let Some(why) = splice(&st, socket, *up).await {
                tracing::info!(reason = why, "a relayed console ended here");
            }
        }),
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// `GET /internal/v1/consoles/attach`: another replica relays a person
/// whose ticket it opened (the ticket in a header); for Kumo's replicas
/// only (the replicas' key).
pub async fn relayed_person(
    State(st): State<AppState>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    crate::app::consoles::replica_caller(&st, header(&headers, crate::consoles::KEY_HEADER))?;
    let ticket = header(&headers, crate::consoles::TICKET_HEADER).unwrap_or_default();
    let opened = crate::app::consoles::attach_relayed(&st, ticket).await?;
    Ok(upgrade_person(st, opened, ws))
}

/// `GET /internal/v1/consoles/dial/{session}`: another replica relays
/// the dial of the host it names (it authenticated the agent); for
/// Kumo's replicas only.
pub async fn relayed_dial(
    State(st): State<AppState>,
    headers: HeaderMap,
    axum::extract::Path(session): axum::extract::Path<Uuid>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    crate::app::consoles::replica_caller(&st, header(&headers, crate::consoles::KEY_HEADER))?;
    let host = header(&headers, crate::consoles::HOST_HEADER)
        .and_then(|h| h.parse::<Uuid>().ok())
        .ok_or_else(|| ApiError::not_found("console session"))?;
    let answered = crate::app::consoles::answer_here(&st, host, session).await?;
    Ok(upgrade_agent(st, answered, ws))
}

/// Passes frames between a websocket here and its relay to another
/// replica until either ends (or this server shuts down): answers why,
/// when it was this side that ended it.
async fn splice(st: &AppState, socket: WebSocket, up: Upstream) -> Option<&'static str> {
    use tokio_tungstenite::tungstenite::Message as Up;
    let (mut tx, mut rx) = socket.split();
    let (mut up_tx, mut up_rx) = up.split();
    let mut closing = st.consoles.closing();
    let why = loop {
        tokio::select! {
            msg = rx.next() => {
                let m = match msg {
                    Some(Ok(Message::Binary(b))) => Up::Binary(b),
                    Some(Ok(Message::Text(t))) => Up::Text(t.as_str().into()),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    _ => break None,
                };
                if up_tx.send(m).await.is_err() {
                    break None;
                }
            }
            msg = up_rx.next() => {
                let m = match msg {
                    Some(Ok(Up::Binary(b))) => Message::Binary(b),
                    Some(Ok(Up::Text(t))) => Message::Text(t.as_str().into()),
                    Some(Ok(Up::Ping(_) | Up::Pong(_) | Up::Frame(_))) => continue,
                    _ => break None,
                };
                if tx.send(m).await.is_err() {
                    break None;
                }
            }
            () = shut(&mut closing) => break Some(RESTARTING),
        }
    };
    if let Some(reason) = why {
        let _ = tx
            .send(event(&ConsoleEvent::Closed {
                reason: reason.to_owned(),
            }))
            .await;
    }
    let _ = tx.close().await;
    let _ = up_tx.close().await;
    why
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
    let answered = crate::app::consoles::answer(&st, &host, session).await?;
    Ok(upgrade_agent(st, answered, ws))
}

fn upgrade_agent(st: AppState, answered: Answered, ws: WebSocketUpgrade) -> Response {
    let (to_people, mut from_writer) = match answered {
        Answered::Here(to_people, from_writer) => (to_people, from_writer),
        Answered::Relayed(up) => {
            return ws.on_upgrade(move |socket| async move {
                splice(&st, socket, *up).await;
            })
        }
    };
    let mut closing = st.consoles.closing();
    ws.on_upgrade(move |socket| async move {
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
    })
}

/// The websocket routes (outside the OpenAPI document: the person's is
/// opened from a ticket's URL, the agent's from its desired state).
pub fn sockets() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/api/v1/consoles/{ticket}", axum::routing::get(person))
        .route("/agent/v1/console/{session}", axum::routing::get(agent))
}

/// The replicas' internal relay routes (outside the OpenAPI document and
/// the API's authentication: the replicas' key is their credential).
pub fn internal() -> axum::Router<AppState> {
    axum::Router::new()
        .route(
            "/internal/v1/consoles/attach",
            axum::routing::get(relayed_person),
        )
        .route(
            "/internal/v1/consoles/dial/{session}",
            axum::routing::get(relayed_dial),
        )
}
