//! Serial consoles: the ticket that opens a console websocket, the mode it
//! opens in, the text messages both ways, and how a server's URL becomes a
//! websocket URL.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// A VM's serial console, authorised: open `url` (a websocket on this
/// server) before `expires_at`, once. Binary messages carry the
/// terminal's bytes both ways: first the console's scrollback, then, after
/// the `live` event, what it prints now. Text messages from the server are
/// [`ConsoleEvent`]s; text messages to it are [`ConsoleControl`]s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConsoleTicket {
    /// `/api/v1/consoles/{ticket}`.
    pub url: String,
    /// The one-time secret in `url` (shown once, never kept).
    pub ticket: String,
    pub expires_at: DateTime<Utc>,
    /// Whether keystrokes are sent (else the console is read-only).
    pub write: bool,
    /// Who writes on the console now, if someone does (a writer opening
    /// it takes it over; they are told).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConsoleMode {
    /// Type into it (members and owners); one writer at a time.
    #[default]
    Write,
    /// Watch it (any member of the tenant, viewers too).
    Read,
}

/// The websocket URL of `path` on the server at `server` (`http://` →
/// `ws://`, `https://` → `wss://`): consoles, for people and agents alike.
pub fn websocket_url(server: &str, path: &str) -> String {
    let server = server.trim_end_matches('/');
    let base = if let Some(rest) = server.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = server.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        server.to_owned()
    };
    format!("{base}{path}")
}

/// A text message a person's console websocket sends (binary messages are
/// the terminal's bytes): the terminal's size, or keys the serial line
/// cannot carry. Both are for the writer only; a viewer's are dropped.
/// The server passes them on to the VM's agent as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ConsoleControl {
    /// The terminal's size: the agent sets it on the guest's serial line
    /// (`stty rows … cols …` through the guest agent, when there is one),
    /// so full-screen programs fit and get `SIGWINCH`.
    Resize { cols: u16, rows: u16 },
    /// Keys pressed on the VM's keyboard (not its serial line).
    Keys { keys: ConsoleKeys },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConsoleKeys {
    CtrlAltDel,
}

/// A text message the server sends on a person's console websocket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ConsoleEvent {
    /// Everything before this was the console's scrollback (what it
    /// printed before this session, up to about 1 MiB, from boot); live
    /// output follows.
    Live,
    /// This session took writing over from `from` (who is now read-only).
    TookOver { from: String },
    /// `by` took writing over: this session is read-only now.
    TakenOver { by: String },
    /// This session is read-only now, and why (its holder's role in the
    /// project no longer allows writing).
    ReadOnly { reason: String },
    /// The session ended, and why.
    Closed { reason: String },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ConsoleParams {
    /// `write` (default) or `read`.
    pub mode: Option<ConsoleMode>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_urls_follow_the_servers_scheme() {
        assert_eq!(websocket_url("http://k:8080/", "/a"), "ws://k:8080/a");
        assert_eq!(
            websocket_url("https://kumo.example", "/a"),
            "wss://kumo.example/a"
        );
    }
}
