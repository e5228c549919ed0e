//! Consoles across replicas (issue 39): two servers on one database; a
//! ticket minted at one opens at the other, the agent's dial reaching the
//! replica the person is not at is relayed to the one holding the VM's
//! console, and so is a second person who opens theirs elsewhere. What a
//! console does on one replica it does through the relay: bytes both
//! ways, a takeover, a viewer's read-only keyboard, a removal closing it.
//! The test stands in for the host's agent (as `vms.rs` does).

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use kumo_api_types::{Role, VmCreate};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::harness::{on_both_backends, SimAgent, TestServer};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn vm(name: &str) -> VmCreate {
    VmCreate {
        name: name.into(),
        gpus: 0,
        gpu_model: None,
        vcpus: Some(2),
        memory_gib: Some(2),
        disk_gib: None,
        template: None,
        service_level: Default::default(),
        ssh_keys: Vec::new(),
        networks: Vec::new(),
        volumes: Vec::new(),
        on_reclaim: None,
        on_host_loss: None,
        notice_seconds: None,
        shares: Vec::new(),
        public_ip: false,
        queue: false,
        reservation: None,
    }
}

/// A counter's value in a server's Prometheus text.
fn counter(st: &kumo_server::AppState, name: &str) -> u64 {
    st.metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// A console ticket for `token` minted at the server at `url`: the
/// websocket URL to open it at the server at `open_at`.
async fn ticket(
    s: &TestServer,
    url: &str,
    open_at: &str,
    token: &str,
    vm: &str,
    mode: &str,
) -> String {
    let r = s
        .http()
        .post(format!(
            "{url}/api/v1/tenants/lab/vms/{vm}/console?mode={mode}"
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let t: kumo_api_types::ConsoleTicket = r.json().await.unwrap();
    format!("{}{}", open_at.replace("http://", "ws://"), t.url)
}

/// The session the agent is asked to dial, as the desired state served
/// at `url` lists it.
async fn asked(agent: &SimAgent, url: &str, vm: uuid::Uuid) -> uuid::Uuid {
    let mut at = agent.clone();
    at.url = url.to_owned();
    let t = Instant::now();
    loop {
        if let Some(c) = at.desired(None).await.consoles.iter().find(|c| c.vm == vm) {
            return c.session;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the agent was never asked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent's dial of `session` at `url`.
async fn dial(agent: &SimAgent, url: &str, session: uuid::Uuid) -> Ws {
    let mut req = format!(
        "{}/agent/v1/console/{session}",
        url.replace("http://", "ws://")
    )
    .into_client_request()
    .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", agent.credential).parse().unwrap(),
    );
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

/// The next bytes on a websocket, skipping events, within 5 s.
async fn bytes(ws: &mut Ws) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => return String::from_utf8_lossy(&b).into_owned(),
            Ok(Some(Ok(_))) => {}
            other => panic!("no bytes within 5 s: {other:?}"),
        }
    }
}

/// The next event other than `live`, within 5 s.
async fn event(ws: &mut Ws) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                if v["event"] != "live" {
                    return v;
                }
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("no event within 5 s: {other:?}"),
        }
    }
}

/// Nothing but events arrives on `ws` within `d`.
async fn no_bytes(ws: &mut Ws, d: Duration) {
    let deadline = Instant::now() + d;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Err(_) => return,
            Ok(Some(Ok(Message::Binary(b)))) => panic!("bytes arrived: {b:?}"),
            Ok(Some(Ok(_))) => {}
            Ok(other) => panic!("ended: {other:?}"),
        }
    }
}

/// Opens a console at `url` while the agent's dial is asked for at
/// `asked_at` and made at `dial_at`: answers the person's end and the
/// agent's.
async fn open_with_dial(
    agent: &SimAgent,
    vm: uuid::Uuid,
    ticket: String,
    asked_at: &str,
    dial_at: &str,
) -> (Ws, Ws) {
    let opened = Instant::now();
    let opening = tokio::spawn(tokio_tungstenite::connect_async(ticket));
    let session = asked(agent, asked_at, vm).await;
    let host = dial(agent, dial_at, session).await;
    let (person, _) = opening.await.unwrap().unwrap();
    println!("console open (dial relayed): {:?}", opened.elapsed());
    (person, host)
}

on_both_backends! {
    async fn a_console_meets_its_agent_across_replicas(s: &TestServer) {
        s.tenant("lab").await;
        let (_, mia) = s.user("mia").await;
        let (_, noa) = s.user("noa").await;
        s.add("lab", "mia", Role::Member).await;
        s.add("lab", "noa", Role::Member).await;
        let mut agent = s.sim_agent("con-r", "cpu-only").await;
        let web = s.admin.create_vm("lab", &vm("web")).await.unwrap();
        let db = s.admin.create_vm("lab", &vm("dbs")).await.unwrap();
        agent.converge().await;
        let b = kumo_server::RunningServer::start(s.server.state.config.as_ref().clone())
            .await
            .unwrap();
        let (a_url, b_url) = (s.url.clone(), b.url());
        let (a, bs) = (&s.server.state, &b.state);

        // Minted at A, opened at B (which holds the console), the agent
        // asked through A's desired state and dialling A: relayed to B.
        let t = ticket(s, &a_url, &b_url, &mia, "web", "write").await;
        let (mut mia_ws, mut host) = open_with_dial(&agent, web.id, t, &a_url, &a_url).await;
        assert_eq!(counter(a, "kumo_console_dial_relays_total"), 1);
        host.send(Message::Binary(b"login: ".to_vec().into())).await.unwrap();
        assert_eq!(bytes(&mut mia_ws).await, "login: ");
        mia_ws.send(Message::Binary(b"root\n".to_vec().into())).await.unwrap();
        assert_eq!(bytes(&mut host).await, "root\n");

        // A second writer opens at A: relayed to B, with the scrollback,
        // and takes the keyboard over (mia is told).
        let t = ticket(s, &b_url, &a_url, &noa, "web", "write").await;
        let relayed = Instant::now();
        let (mut noa_ws, _) = tokio_tungstenite::connect_async(t).await.unwrap();
        println!("console open (person relayed to a live console): {:?}", relayed.elapsed());
        assert_eq!(counter(a, "kumo_console_person_relays_total"), 1);
        assert_eq!(event(&mut noa_ws).await["event"], "took_over");
        assert_eq!(bytes(&mut noa_ws).await, "login: ", "the scrollback");
        let ev = event(&mut mia_ws).await;
        assert_eq!((ev["event"].as_str(), ev["by"].as_str()), (Some("taken_over"), Some("noa")));
        noa_ws.send(Message::Binary(b"uname\n".to_vec().into())).await.unwrap();
        assert_eq!(bytes(&mut host).await, "uname\n");
        host.send(Message::Binary(b"Linux\n".to_vec().into())).await.unwrap();
        assert_eq!(bytes(&mut noa_ws).await, "Linux\n");
        assert_eq!(bytes(&mut mia_ws).await, "Linux\n");

        // Demoted while relayed: read-only within the re-check, her keys
        // never reach the VM.
        s.add("lab", "noa", Role::Viewer).await;
        let ev = event(&mut noa_ws).await;
        assert_eq!(ev["event"], "read_only", "{ev}");
        noa_ws.send(Message::Binary(b"as-viewer".to_vec().into())).await.unwrap();
        noa_ws
            .send(Message::Text(r#"{"type":"keys","keys":"ctrl-alt-del"}"#.into()))
            .await
            .unwrap();
        no_bytes(&mut host, Duration::from_secs(2)).await;
        // Removed: the relayed console closes and says why; mia's goes on.
        s.admin.remove_member("lab", "noa").await.unwrap();
        let ev = event(&mut noa_ws).await;
        assert_eq!(ev["event"], "closed", "{ev}");
        assert!(ev["reason"].as_str().unwrap_or("").contains("no longer a member"), "{ev}");
        host.send(Message::Binary(b"$ ".to_vec().into())).await.unwrap();
        assert_eq!(bytes(&mut mia_ws).await, "$ ");

        // The other way round: minted at B, opened at A (which holds it),
        // the agent asked through B and dialling B: relayed to A.
        let t = ticket(s, &b_url, &a_url, &mia, "dbs", "write").await;
        let (mut mia_db, mut host_db) = open_with_dial(&agent, db.id, t, &b_url, &b_url).await;
        assert_eq!(counter(bs, "kumo_console_dial_relays_total"), 1);
        host_db.send(Message::Binary(b"db login: ".to_vec().into())).await.unwrap();
        assert_eq!(bytes(&mut mia_db).await, "db login: ");
        mia_db.send(Message::Binary(b"postgres\n".to_vec().into())).await.unwrap();
        assert_eq!(bytes(&mut host_db).await, "postgres\n");
        // A viewer's ticket minted at A opens at B: relayed to A.
        s.add("lab", "noa", Role::Viewer).await;
        let t = ticket(s, &a_url, &b_url, &noa, "dbs", "read").await;
        let (mut noa_db, _) = tokio_tungstenite::connect_async(t).await.unwrap();
        assert_eq!(counter(bs, "kumo_console_person_relays_total"), 1);
        assert_eq!(bytes(&mut noa_db).await, "db login: ", "the scrollback");
        noa_db.send(Message::Binary(b"x".to_vec().into())).await.unwrap();
        no_bytes(&mut host_db, Duration::from_millis(500)).await;

        // mia removed: both her consoles close, at either replica.
        s.admin.remove_member("lab", "mia").await.unwrap();
        for ws in [&mut mia_db, &mut mia_ws] {
            let ev = event(ws).await;
            assert_eq!(ev["event"], "closed", "{ev}");
            assert!(ev["reason"].as_str().unwrap_or("").contains("no longer a member"), "{ev}");
        }
        b.stop().await.unwrap();
    }
}
