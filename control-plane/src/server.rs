//! The composition root: opens the database, builds the shared state,
//! starts the background jobs and serves the HTTP stack.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::app::bootstrap;
use crate::config::Config;
use crate::context::AppState;
use crate::db;
use crate::metrics::Metrics;

/// The data directory holds the database and the bootstrap token: only
/// the server's user may enter it (0700), whatever the umask.
fn private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| anyhow::anyhow!("cannot create data dir {}: {e}", dir.display()))
}

/// The SQLite database and its journal files: readable by the server's
/// user alone (0600). SQLite gives later journal files the database's mode.
fn private_files(db: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let path = std::path::PathBuf::from(name);
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| anyhow::anyhow!("cannot make {} private: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// A server bound to its address and serving in the background.
pub struct RunningServer {
    pub addr: SocketAddr,
    pub state: AppState,
    /// Where the bootstrap admin token was written, on the start that created it.
    pub admin_token_file: Option<PathBuf>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningServer {
    /// Connects to the database, migrates, bootstraps, binds and serves.
    pub async fn start(config: Config) -> anyhow::Result<RunningServer> {
        if config.database_url.starts_with("sqlite:") {
            private_dir(&config.data_dir)?;
        }
        let db = db::open(&config.database_url).await?;
        if let Some(file) = db::sqlite_file(&config.database_url) {
            private_files(&file)?;
        }
        let reads = db::open_reads(&config.database_url, &db).await?;
        let admin_token_file =
            bootstrap::bootstrap(&db, &config.data_dir, config.clock.now()).await?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener.local_addr()?;
        let overcommit = config.storage.overcommit;
        let state = AppState {
            db,
            reads,
            metrics: Arc::new(Metrics::new()),
            config: Arc::new(config),
            signals: Arc::default(),
            leases: Arc::default(),
            consoles: Arc::default(),
            capacity: Arc::new(crate::store::capacity::Capacity::with_overcommit(
                overcommit,
            )),
            sso: Arc::default(),
            churn: Arc::default(),
            idle_checked: Arc::default(),
            overpromised: Arc::default(),
        };
        // Marks first: a change landing during the full read is followed.
        state.capacity.catch_up(&state.db, &state.signals).await?;
        state.capacity.refresh_all(&state.db).await?;
        // Known to the other replicas before it serves: a console relayed
        // here finds it.
        crate::app::consoles::register(&state, addr).await?;
        let detector = tokio::spawn(crate::app::jobs::lost_hosts::run(state.clone()));
        let reaper = tokio::spawn(crate::app::jobs::reclaimer::run(state.clone()));
        let edge_keeper = tokio::spawn(crate::app::jobs::edge_keeper::run(state.clone()));
        let lease_keeper = tokio::spawn(crate::app::jobs::lease_keeper::run(state.clone()));
        let host_changes = tokio::spawn(crate::app::jobs::host_changes::run(state.clone()));
        let compaction = tokio::spawn(crate::app::jobs::ledger_compaction::run(state.clone()));
        let replicas = tokio::spawn(crate::app::jobs::replicas::run(state.clone()));
        let app = crate::http::router::router(state.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let signals = state.signals.clone();
        let consoles = state.consoles.clone();
        let last = state.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async move {
                let _ = rx.await;
                signals.close();
                consoles.close_all();
            })
            .await;
            detector.abort();
            reaper.abort();
            edge_keeper.abort();
            lease_keeper.abort();
            host_changes.abort();
            compaction.abort();
            replicas.abort();
            // The others claim this replica's consoles at once, not once
            // it is stale.
            if let Err(e) = crate::app::consoles::retire(&last).await {
                tracing::warn!(error = %e, "this replica's consoles not given up at shutdown");
            }
            // Beats heard since the last batch, so a restarted or
            // replaced replica loses none.
            if let Err(e) = crate::app::jobs::lease_keeper::flush(&last).await {
                tracing::warn!(error = %e, "host leases not written at shutdown");
            }
            served
        });
        Ok(RunningServer {
            addr,
            state,
            admin_token_file,
            shutdown: Some(tx),
            task,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting connections, lets requests in flight finish, and
    /// closes the database pool.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.halt().await
    }

    /// [`RunningServer::stop`] in place: the server serves no more (a
    /// restart then starts another on the same address).
    pub async fn halt(&mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await??;
        self.state.db.clone().close().await?;
        Ok(())
    }

    /// Serves until the task ends (it ends only on shutdown or an IO error).
    pub async fn wait(&mut self) -> anyhow::Result<()> {
        (&mut self.task).await??;
        Ok(())
    }

    pub fn shutdown_handle(&mut self) -> Option<oneshot::Sender<()>> {
        self.shutdown.take()
    }
}
