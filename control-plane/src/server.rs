//! Assembling the HTTP stack and running it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::Router;
use sea_orm::DatabaseConnection;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::ServiceBuilder;
use tower_http::compression::CompressionLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::{api, bootstrap, db, middleware};

#[derive(Clone)]
pub struct AppState {
    pub db: DatabaseConnection,
    pub metrics: Arc<Metrics>,
    pub config: Arc<Config>,
    pub signals: Arc<crate::signals::HostSignals>,
    pub capacity: Arc<crate::capacity::Capacity>,
    pub sso: Arc<crate::sso::Sso>,
}

/// The whole HTTP application: API, docs, health, metrics.
pub fn router(state: AppState) -> Router {
    let (api_routes, openapi) = api::router().split_for_parts();
    let api_routes = api_routes
        .layer(from_fn_with_state(
            state.clone(),
            middleware::idempotency::layer,
        ))
        .layer(from_fn_with_state(state.clone(), middleware::authn::layer));
    let timeout = state.config.request_timeout;
    let body_limit = state.config.body_limit_bytes;
    Router::new()
        .merge(api_routes)
        .merge(api::docs::router(Arc::new(openapi)))
        .merge(crate::sso::routes())
        .merge(crate::device_login::routes())
        .merge(crate::portal::routes())
        // An empty 404 becomes a problem in the normaliser below.
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(from_fn_with_state(state.clone(), middleware::metrics::layer))
        .with_state(state)
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                .layer(TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                    let request_id = req
                        .headers()
                        .get(crate::extract::REQUEST_ID_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id)
                })
                // One access-log line per request, with status and latency.
                .on_response(DefaultOnResponse::new().level(Level::INFO))
                .on_failure(DefaultOnFailure::new().level(Level::WARN)))
                .layer(PropagateRequestIdLayer::x_request_id())
                // Outside the normaliser, which must read bodies uncompressed.
                .layer(CompressionLayer::new())
                .layer(from_fn(middleware::problems::layer))
                .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeout))
                .layer(DefaultBodyLimit::max(body_limit)),
        )
}

/// Marks hosts whose agents fell silent as `unreachable`. Idempotent, so
/// several replicas running it at once do no harm.
async fn lost_host_detector(state: AppState) {
    use crate::entity::hosts;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let timeout = state.config.heartbeat_timeout;
    let mut tick = tokio::time::interval((timeout / 4).max(std::time::Duration::from_millis(250)));
    loop {
        tick.tick().await;
        let Ok(limit) = chrono::Duration::from_std(timeout) else {
            return;
        };
        let cutoff = chrono::Utc::now() - limit;
        let lost = hosts::Entity::update_many()
            .col_expr(
                hosts::Column::State,
                sea_orm::sea_query::Expr::value("unreachable"),
            )
            .filter(hosts::Column::State.is_in(["ready", "draining"]))
            .filter(hosts::Column::LastHeartbeatAt.lt(cutoff))
            .exec(&state.db)
            .await;
        match lost {
            Ok(r) if r.rows_affected > 0 => {
                tracing::warn!(hosts = r.rows_affected, "hosts became unreachable")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "lost-host detector could not run"),
        }
    }
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
            std::fs::create_dir_all(&config.data_dir).map_err(|e| {
                anyhow::anyhow!("cannot create data dir {}: {e}", config.data_dir.display())
            })?;
        }
        let db = db::open(&config.database_url).await?;
        let admin_token_file = bootstrap::bootstrap(&db, &config.data_dir).await?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener.local_addr()?;
        let state = AppState {
            db,
            metrics: Arc::new(Metrics::new()),
            config: Arc::new(config),
            signals: Arc::default(),
            capacity: Arc::default(),
            sso: Arc::default(),
        };
        state.capacity.refresh_all(&state.db).await?;
        let detector = tokio::spawn(lost_host_detector(state.clone()));
        let reaper = tokio::spawn(crate::reaper::run(state.clone()));
        let app = router(state.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await;
            detector.abort();
            reaper.abort();
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
