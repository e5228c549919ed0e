//! The serial console end to end on QEMU (TCG): a real guest with a shell
//! on ttyS0 under `qemu:///system`, its agent running its loop. A person
//! opens the console through the API's websocket (the agent dials the
//! server; no port on the host), types a command and reads its output; a
//! second writer takes over and the first is told; a viewer watches but
//! cannot type; revoking the token a console was opened with closes it.

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
                events.push(serde_json::from_str(t.as_str()).unwrap());
                if want.starts_with('{') {
                    break;
                }
            }
            Ok(Some(Ok(_))) => {}
            _ => break,
        }
    }
    (text, events)
}

async fn type_line(ws: &mut Ws, line: &str) {
    ws.send(Message::Binary(format!("{line}\n").into_bytes().into()))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_types_on_the_serial_console_through_the_server() {
    let guest = guest_dir();
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("con").await;
    let (_work, config) = qemu_host(&s, &guest, "con-host").await;
    let agent = Agent::start(config).await.unwrap();
    let running = tokio::spawn(agent.run());
    let mut cleanup = Cleanup(Vec::new());
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

    // A writer types a command and reads what it printed (not its echo).
    let opened = Instant::now();
    let (t, mut a) = open(&s, &s.admin_token, "write").await;
    assert!(t.write && t.writer.is_none(), "{t:?}");
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
    let (t, mut viewer) = open(&s, &s.admin_token, "read").await;
    assert!(!t.write);
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

    // A second writer takes over: the first is told and types no more.
    let (t, mut b) = open(&s, &s.admin_token, "write").await;
    assert_eq!(t.writer.as_deref(), Some("admin"), "{t:?}");
    let (_, ev) = read_until(&mut a, "{", Duration::from_secs(10)).await;
    assert_eq!(
        ev.first().map(|e| e["event"].clone()),
        Some(json!("taken_over")),
        "{ev:?}"
    );
    type_line(&mut a, "echo old-$((3*3))").await;
    type_line(&mut b, "echo new-$((4*4))").await;
    let (out, _) = read_until(&mut b, "new-16", Duration::from_secs(30)).await;
    assert!(out.contains("new-16") && !out.contains("old-9"), "{out}");

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
    let (_, ev) = read_until(&mut c, "{", Duration::from_secs(10)).await;
    assert_eq!(
        ev.first().map(|e| e["event"].clone()),
        Some(json!("closed")),
        "{ev:?}"
    );
    assert!(
        revoked.elapsed() < Duration::from_secs(3),
        "{:?}",
        revoked.elapsed()
    );

    running.abort();
    s.stop().await;
}
