//! Moving volumes (and shelved VMs' root disks) between hosts, agent to
//! agent.
//!
//! The destination's agent fetches the volume from the source's agent
//! (`GET <transfer url>/v1/volumes/<id>`, a root disk from
//! `/v1/root-disks/<vm>`) and keeps it only when it is whole and its
//! SHA-256 matches what the source announced
//! ([`crate::storage::Backend::import`]: written under a partial name,
//! renamed at the end). The server only brokers:
//!
//! 1. the destination makes a random token, keeps it in memory only and
//!    reports its SHA-256 (`VolumeStatus.token_sha256`, state `importing`);
//! 2. the server hands that hash to the source (`DesiredState.exports`);
//! 3. the source serves the volume to whoever shows a token with that
//!    hash, and to nobody once the move is over (its desired state no
//!    longer lists it).
//!
//! So no token is ever stored or sent by the server, one move's token
//! opens that one volume only, and it dies with the move. An import
//! runs in its own task: a large copy never holds up the pass, and one
//! volume's failure (a source that is gone, a checksum that does not
//! match) is reported for that volume and retried every
//! [`RETRY`]. Imports take the host's slots for long storage work
//! ([`crate::storage::jobs::Slots`]: so many per tenant, so many per
//! host); exports are bounded per host on their own (an import waiting
//! for an export on the other host must not hold the slot that export
//! would need).
//!
//! A root disk's move carries the VM's UEFI variable store too
//! (`/v1/root-disks/<vm>/nvram`, the same token), fetched first.
//!
//! What travels is the data only: a destination that asks for
//! [`extents::CONTENT_TYPE`] gets the volume's data extents (holes and
//! zeros left out, checked by the stream's own SHA-256); one that does
//! not (an agent from before) gets every byte, raw, as before.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kumo_api_types::{DesiredExport, DesiredImport, TransferKind, VolumeActual, VolumeStatus};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::storage::jobs::{Limits, Slots};
use crate::storage::root_disks::RootDisks;
use crate::storage::{copy_hashing, extents, Backend, Incoming, StorageError, GIB};

/// The response header with the SHA-256 (hex) of the volume's contents.
pub const SHA256_HEADER: &str = "x-kumo-sha256";

/// How long a failed import waits before it is tried again.
pub const RETRY: Duration = Duration::from_secs(2);

/// Chunks in flight between the network and the blocking storage side.
const CHANNEL: usize = 8;

/// A transfer's token: 32 random bytes, hex.
fn new_token() -> String {
    let mut b = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
    hex::encode(b)
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// One import this agent is doing or has tried.
struct Import {
    /// Shown to the source; never leaves this process otherwise.
    token: String,
    running: bool,
    /// Bumped for every task started, so a task that was superseded (its
    /// volume dropped and asked again) does not write its outcome.
    generation: u64,
    failed: Option<(String, Instant)>,
    task: Option<tokio::task::AbortHandle>,
}

/// What moves: a volume's or a root disk's id.
type Key = (TransferKind, Uuid);

/// The host's side of moves: what it serves and what it fetches.
pub struct Transfers {
    storage: Arc<dyn Backend>,
    disks: RootDisks,
    /// What is served to other hosts, with the SHA-256 of the token each
    /// is fetched with.
    exports: Mutex<BTreeMap<Key, String>>,
    /// What is being served right now (one fetch at a time each).
    serving: Mutex<BTreeSet<Key>>,
    imports: Mutex<BTreeMap<Key, Import>>,
    /// Slots imports run in (shared with the host's other long work).
    slots: Arc<Slots>,
    /// Exports sent at once.
    sending: Arc<tokio::sync::Semaphore>,
    /// Bytes sent by exports and received by imports, in all (tests,
    /// logs).
    pub bytes_sent: std::sync::atomic::AtomicU64,
    http: reqwest::Client,
}

impl Transfers {
    /// Transfers with slots of their own (the default limits).
    pub fn new(storage: Arc<dyn Backend>, disks: RootDisks) -> Arc<Transfers> {
        Self::with_slots(storage, disks, Slots::new(Limits::default()))
    }

    /// Transfers whose imports run in `slots`; as many exports at once as
    /// the slots' host limit.
    pub fn with_slots(
        storage: Arc<dyn Backend>,
        disks: RootDisks,
        slots: Arc<Slots>,
    ) -> Arc<Transfers> {
        Arc::new(Transfers {
            storage,
            disks,
            exports: Mutex::default(),
            serving: Mutex::default(),
            imports: Mutex::default(),
            sending: Arc::new(tokio::sync::Semaphore::new(slots.limits().per_host)),
            slots,
            bytes_sent: Default::default(),
            // No overall timeout: a volume takes as long as it takes; a
            // source that stops sending is caught by the read timeout.
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .read_timeout(Duration::from_secs(300))
                .build()
                .unwrap_or_default(),
        })
    }

    /// The volumes to serve, as the desired state says: any other is
    /// refused from now on.
    pub fn set_exports(&self, exports: &[DesiredExport]) {
        *self.exports.lock().unwrap_or_else(|e| e.into_inner()) = exports
            .iter()
            .map(|e| ((e.kind, e.volume), e.token_sha256.to_ascii_lowercase()))
            .collect();
    }

    /// Brings the imports of one kind to what the desired state says:
    /// starts those not running (a failed one after [`RETRY`]), stops
    /// those no longer wanted; answers what to report of each. `present`
    /// says whether one is here, whole (`ready`), and its size in GiB
    /// where that is reported.
    pub fn converge_imports(
        self: &Arc<Self>,
        kind: TransferKind,
        want: &[DesiredImport],
        present: &dyn Fn(Uuid) -> Option<Option<u32>>,
    ) -> Vec<VolumeStatus> {
        let want: Vec<&DesiredImport> = want.iter().filter(|w| w.kind == kind).collect();
        let mut imports = self.imports.lock().unwrap_or_else(|e| e.into_inner());
        imports.retain(|(k, id), i| {
            let keep = *k != kind || want.iter().any(|w| w.volume == *id);
            if !keep {
                if let Some(t) = &i.task {
                    t.abort();
                }
            }
            keep
        });
        let mut report = Vec::new();
        for w in want {
            if let Some(size_gib) = present(w.volume) {
                imports.remove(&(kind, w.volume));
                report.push(VolumeStatus {
                    id: w.volume,
                    state: VolumeActual::Ready,
                    size_gib,
                    reason: None,
                    snapshots: Vec::new(),
                    token_sha256: None,
                });
                continue;
            }
            let i = imports.entry((kind, w.volume)).or_insert_with(|| Import {
                token: new_token(),
                running: false,
                generation: 0,
                failed: None,
                task: None,
            });
            let due = i
                .failed
                .as_ref()
                .is_none_or(|(_, at)| at.elapsed() >= RETRY);
            if !i.running && due {
                i.running = true;
                i.generation += 1;
                let (me, w, token, generation) =
                    (self.clone(), w.clone(), i.token.clone(), i.generation);
                i.task = Some(
                    tokio::spawn(async move {
                        // Its turn among the host's long storage work
                        // (reported `importing` meanwhile).
                        let _slot = me.slots.acquire(w.tenant).await;
                        let outcome = me.fetch(&w, &token).await;
                        if let Err(e) = &outcome {
                            tracing::warn!(volume = %w.volume, from = %w.from, error = %e, "volume import failed; retrying");
                        } else {
                            tracing::info!(volume = %w.volume, from = %w.from, "volume imported");
                        }
                        let mut imports = me.imports.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(i) = imports.get_mut(&(w.kind, w.volume)) {
                            if i.generation == generation {
                                i.running = false;
                                i.failed = outcome.err().map(|e| (e, Instant::now()));
                            }
                        }
                    })
                    .abort_handle(),
                );
            }
            let (state, reason) = match (&i.failed, i.running) {
                (Some((why, _)), false) => (VolumeActual::Failed, Some(why.clone())),
                _ => (VolumeActual::Importing, None),
            };
            report.push(VolumeStatus {
                id: w.volume,
                state,
                size_gib: None,
                reason,
                snapshots: Vec::new(),
                token_sha256: Some(sha256_hex(&i.token)),
            });
        }
        report
    }

    /// Whether an import is under way (for tests and logs).
    pub fn importing(&self, kind: TransferKind, id: Uuid) -> bool {
        self.imports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(kind, id))
            .is_some_and(|i| i.running)
    }

    /// A moving root disk's UEFI variable store, kept before the disk so
    /// that the VM, once its disk is here, boots from the store it had.
    /// A source with none (a BIOS VM: 204) or from before stores moved
    /// (a bare 404) sends nothing, and the VM starts from a fresh store
    /// (one left here by an earlier try is dropped).
    async fn fetch_nvram(&self, w: &DesiredImport, token: &str) -> Result<(), String> {
        let url = format!(
            "{}/v1/{}/{}/nvram",
            w.from.trim_end_matches('/'),
            path_of(w.kind),
            w.volume
        );
        let resp = self
            .http
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| format!("cannot reach the source at {}: {e}", w.from))?;
        let status = resp.status();
        if !status.is_success() || status == StatusCode::NO_CONTENT {
            let body = resp.text().await.unwrap_or_default();
            // None to bring: a BIOS VM (204), or a source from before
            // stores moved (its router's bare 404; a move it has not
            // been told of yet is a 404 that says so, and is tried again).
            let none = status == StatusCode::NO_CONTENT
                || (status == StatusCode::NOT_FOUND && body.trim().is_empty());
            if none {
                let vm = w.volume;
                return self.on_disks(move |disks| disks.forget_nvram(vm)).await;
            }
            let body: String = body.chars().take(200).collect();
            return Err(format!(
                "the source answered {status} for the variable store: {}",
                body.trim()
            ));
        }
        let sha = sha256_of(resp.headers()).ok_or(format!(
            "the source sent no {SHA256_HEADER} for the variable store"
        ))?;
        // Bounded as it arrives, whatever a length would say.
        let mut bytes = Vec::new();
        let mut resp = resp;
        while let Some(c) = resp
            .chunk()
            .await
            .map_err(|e| format!("receiving the variable store: {e}"))?
        {
            bytes.extend_from_slice(&c);
            if bytes.len() as u64 > crate::storage::root_disks::NVRAM_MAX_BYTES {
                return Err("the source sent a variable store too large to be one".into());
            }
        }
        let vm = w.volume;
        self.on_disks(move |disks| disks.receive_nvram(vm, &bytes, &sha))
            .await
    }

    /// Runs `f` on the root disks off the async threads (file IO), its
    /// failure said as the variable store's.
    async fn on_disks(
        &self,
        f: impl FnOnce(&RootDisks) -> Result<(), StorageError> + Send + 'static,
    ) -> Result<(), String> {
        let disks = self.disks.clone();
        tokio::task::spawn_blocking(move || f(&disks))
            .await
            .map_err(|e| format!("variable store task: {e}"))?
            .map_err(|e| format!("the variable store: {e}"))
    }

    /// Fetches one volume (or root disk, with its variable store) from
    /// its source into the pool.
    async fn fetch(&self, w: &DesiredImport, token: &str) -> Result<(), String> {
        if w.kind == TransferKind::RootDisk {
            self.fetch_nvram(w, token).await?;
        }
        let url = format!(
            "{}/v1/{}/{}",
            w.from.trim_end_matches('/'),
            path_of(w.kind),
            w.volume
        );
        let mut resp = self
            .http
            .get(&url)
            .bearer_auth(token)
            .header(header::ACCEPT, extents::CONTENT_TYPE)
            .send()
            .await
            .map_err(|e| format!("cannot reach the source at {}: {e}", w.from))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            let body: String = body.chars().take(200).collect();
            return Err(format!("the source answered {status}: {}", body.trim()));
        }
        let header_of = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        // Extents from a source that knows them; every byte, raw, from one
        // from before them.
        let sparse =
            header_of(header::CONTENT_TYPE.as_str()).as_deref() == Some(extents::CONTENT_TYPE);
        let (size, sha) = if sparse {
            let size = header_of(extents::SIZE_HEADER)
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(format!("the source sent no {}", extents::SIZE_HEADER))?;
            (size, None)
        } else {
            let size = resp
                .content_length()
                .ok_or("the source sent no Content-Length")?;
            let sha =
                sha256_of(resp.headers()).ok_or(format!("the source sent no {SHA256_HEADER}"))?;
            (size, Some(sha))
        };
        if size > u64::from(w.size_gib).saturating_mul(GIB) {
            return Err(format!(
                "the source sent {size} bytes for a volume of {} GiB",
                w.size_gib
            ));
        }
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, String>>(CHANNEL);
        let (storage, disks) = (self.storage.clone(), self.disks.clone());
        let (id, kind) = (w.volume, w.kind);
        let import = tokio::task::spawn_blocking(move || {
            let mut reader = ChannelReader {
                rx,
                chunk: Bytes::new(),
            };
            let incoming = match &sha {
                Some(sha256) => Incoming::Raw {
                    reader: &mut reader,
                    sha256,
                },
                None => Incoming::Extents(&mut reader),
            };
            crate::storage::in_background(|| match kind {
                TransferKind::Volume => storage.receive(id, size, incoming),
                TransferKind::RootDisk => disks.receive(id, size, incoming),
            })
        });
        // An abort of this task drops `tx`: the import sees a short stream
        // and leaves nothing.
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    if tx.send(Ok(c)).await.is_err() {
                        break; // the import stopped: its error says why
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(Err(format!("receiving: {e}"))).await;
                    break;
                }
            }
        }
        drop(tx);
        import
            .await
            .map_err(|e| format!("import task: {e}"))?
            .map_err(|e| e.to_string())
    }
}

/// Blocking `Read` over chunks arriving from an async task.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, String>>,
    chunk: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Ok(c)) => self.chunk = c,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk = self.chunk.slice(n..);
        Ok(n)
    }
}

/// Blocking `Write` into chunks for an async response body.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    sent: Arc<Transfers>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "fetch ended"))?;
        self.sent
            .bytes_sent
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The SHA-256 a response announces, when it is one (64 hex digits).
fn sha256_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SHA256_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned)
}

/// The transfer server's path for a kind.
fn path_of(kind: TransferKind) -> &'static str {
    match kind {
        TransferKind::Volume => "volumes",
        TransferKind::RootDisk => "root-disks",
    }
}

/// Frees a volume's one fetch when the response is done or dropped.
struct Serving(Arc<Transfers>, Key);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0
            .serving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, why.to_owned()).into_response()
}

/// `GET /v1/volumes/{id}`: see [`serve_one`].
async fn serve_volume(
    State(t): State<Arc<Transfers>>,
    Path(id): Path<Uuid>,
    headers: HeaderMap,
) -> Response {
    serve_one(t, (TransferKind::Volume, id), headers).await
}

/// `GET /v1/root-disks/{vm}`: see [`serve_one`].
async fn serve_root_disk(
    State(t): State<Arc<Transfers>>,
    Path(id): Path<Uuid>,
    headers: HeaderMap,
) -> Response {
    serve_one(t, (TransferKind::RootDisk, id), headers).await
}

/// The refusal of a request whose `headers` do not show the token of a
/// move of `key` under way; `None` for one that does.
fn refusal(t: &Transfers, key: Key, headers: &HeaderMap) -> Option<Response> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let expected = t
        .exports
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned();
    let Some(expected) = expected else {
        return Some(refuse(
            StatusCode::NOT_FOUND,
            "no move of this volume is under way",
        ));
    };
    let shown = token.map(sha256_hex).unwrap_or_default();
    if !bool::from(subtle::ConstantTimeEq::ct_eq(
        shown.as_bytes(),
        expected.as_bytes(),
    )) {
        return Some(refuse(StatusCode::UNAUTHORIZED, "not this move's token"));
    }
    None
}

/// `GET /v1/root-disks/{vm}/nvram`: the VM's UEFI variable store, to the
/// bearer of its root disk's move token, with its SHA-256 in
/// [`SHA256_HEADER`]; 204 when the VM has none (a BIOS VM).
async fn serve_nvram(
    State(t): State<Arc<Transfers>>,
    Path(id): Path<Uuid>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = refusal(&t, (TransferKind::RootDisk, id), &headers) {
        return refused;
    }
    let disks = t.disks.clone();
    let read = tokio::task::spawn_blocking(move || disks.read_nvram(id)).await;
    match read {
        Ok(Ok(Some(bytes))) => {
            let sha = hex::encode(Sha256::digest(&bytes));
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                    (header::HeaderName::from_static(SHA256_HEADER), sha),
                ],
                bytes,
            )
                .into_response()
        }
        Ok(Ok(None)) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => refuse(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// A volume's (or root disk's) raw contents, `Content-Length` long,
/// with their SHA-256 in [`SHA256_HEADER`]; only to the bearer of the
/// move's token, one fetch at a time.
async fn serve_one(t: Arc<Transfers>, key: Key, headers: HeaderMap) -> Response {
    let (kind, id) = key;
    if let Some(refused) = refusal(&t, key, &headers) {
        return refused;
    }
    if !t
        .serving
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key)
    {
        return refuse(StatusCode::CONFLICT, "the volume is being sent already");
    }
    let serving = Serving(t.clone(), key);
    // Bounded per host; the fetch waits for its turn.
    let Ok(sending) = t.sending.clone().acquire_owned().await else {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "not sending volumes");
    };
    let sparse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|m| m.trim() == extents::CONTENT_TYPE));
    // Raw (a destination from before extents): one pass over the contents
    // for the header's size and checksum, a second (after rewinding) to
    // send them: one qcow2 conversion. Extents: the size, then the data
    // as it is read, with the stream's own checksum at its end.
    let (head_tx, head_rx) = tokio::sync::oneshot::channel::<Result<(u64, String), String>>();
    let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL);
    let (storage, disks, counter) = (t.storage.clone(), t.disks.clone(), t.clone());
    tokio::task::spawn_blocking(move || {
        let _serving = serving;
        let _sending = sending;
        let mut head = Some(head_tx);
        let mut send = |f: &mut std::fs::File| {
            let io = StorageError::io;
            let mut w = std::io::BufWriter::with_capacity(
                1 << 20,
                ChannelWriter {
                    tx: tx.clone(),
                    sent: counter.clone(),
                },
            );
            if sparse {
                // A block device's length is where its end is.
                let size = f
                    .seek(SeekFrom::End(0))
                    .map_err(io("measuring the volume"))?;
                if let Some(h) = head.take() {
                    let _ = h.send(Ok((size, String::new())));
                }
                let data = extents::send(f, size, &mut w).map_err(io("sending the volume"))?;
                tracing::info!(volume = %id, size, data, "volume sent as extents");
                return Ok(());
            }
            let measured =
                copy_hashing(f, &mut std::io::sink()).map_err(io("hashing the volume"))?;
            f.seek(SeekFrom::Start(0))
                .map_err(io("rewinding the volume"))?;
            if let Some(h) = head.take() {
                let _ = h.send(Ok(measured));
            }
            std::io::copy(f, &mut w)
                .and_then(|_| w.flush())
                .map_err(io("sending the volume"))
        };
        let sent = crate::storage::in_background(|| match kind {
            TransferKind::Volume => storage.with_contents(id, &mut send),
            TransferKind::RootDisk => disks.with_contents(id, &mut send),
        });
        if let Err(e) = sent {
            match head.take() {
                Some(h) => {
                    let _ = h.send(Err(e.to_string()));
                }
                None => {
                    tracing::warn!(volume = %id, error = %e, "sending a volume failed");
                    let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
                }
            }
        }
    });
    let (size, sha) = match head_rx.await {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, &e),
        Err(_) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, "the export stopped"),
    };
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    if sparse {
        return (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, extents::CONTENT_TYPE.to_owned()),
                (
                    header::HeaderName::from_static(extents::SIZE_HEADER),
                    size.to_string(),
                ),
            ],
            body,
        )
            .into_response();
    }
    (
        StatusCode::OK,
        [
            (header::CONTENT_LENGTH, size.to_string()),
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::HeaderName::from_static(SHA256_HEADER), sha),
        ],
        body,
    )
        .into_response()
}

/// The transfer server's routes.
pub fn router(t: Arc<Transfers>) -> axum::Router {
    axum::Router::new()
        .route("/v1/volumes/{id}", axum::routing::get(serve_volume))
        .route("/v1/root-disks/{id}", axum::routing::get(serve_root_disk))
        .route("/v1/root-disks/{id}/nvram", axum::routing::get(serve_nvram))
        .with_state(t)
}

/// Serves transfers on `listener` until the process ends.
pub fn serve(listener: tokio::net::TcpListener, t: Arc<Transfers>) {
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(t)).await {
            tracing::error!(error = %e, "the transfer server stopped");
        }
    });
}
