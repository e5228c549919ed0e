//! Opening the database and bringing its schema up to date.

use std::time::Duration;

use kumo_migrations::{Migrator, MigratorTrait};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseBackend, DatabaseConnection};

#[derive(Debug, thiserror::Error)]
pub enum DbOpenError {
    #[error("cannot connect to the database: {0}")]
    Connect(sea_orm::DbErr),
    #[error("cannot migrate the database schema: {0}")]
    Migrate(sea_orm::DbErr),
}

/// The file of a `sqlite:` URL (`sqlite://PATH?mode=rwc`), or `None` for
/// other databases and in-memory ones.
pub fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or("");
    (!path.is_empty() && path != ":memory:").then(|| std::path::PathBuf::from(path))
}

/// Connects and runs pending migrations. Migrations are safe to start from
/// several replicas at once on PostgreSQL: sea-orm runs each in a
/// transaction and records it in `seaql_migrations`. They only expand the
/// schema, so replicas of the previous release go on serving beside the
/// new one (docs/src/operator/upgrades.md).
pub async fn open(url: &str) -> Result<DatabaseConnection, DbOpenError> {
    let mut opts = ConnectOptions::new(url.to_owned());
    let sqlite = url.starts_with("sqlite:");
    // SQLite allows one writer. With several pooled connections, writers
    // wait in SQLite's busy handler, which sleeps in steps of up to 100 ms:
    // 8 concurrent writers measured p99 726 ms. One connection queues them
    // in tokio instead (p99 19 ms, reads still 4,500/s); see BENCHMARKS.md.
    opts.max_connections(if sqlite { 1 } else { 16 })
        .min_connections(1)
        .connect_timeout(Duration::from_secs(10))
        .acquire_timeout(Duration::from_secs(10))
        .sqlx_logging(false);
    let db = Database::connect(opts)
        .await
        .map_err(DbOpenError::Connect)?;
    if db.get_database_backend() == DatabaseBackend::Sqlite {
        // WAL lets readers proceed while one writer commits; the setting is
        // stored in the database file.
        db.execute_unprepared("PRAGMA journal_mode=WAL")
            .await
            .map_err(DbOpenError::Connect)?;
    }
    Migrator::up(&db, None)
        .await
        .map_err(DbOpenError::Migrate)?;
    Ok(db)
}

/// Read-only SQLite connections beside the one writer.
const SQLITE_READERS: u32 = 4;

/// The pool for reads that need no transaction. On a SQLite file: its own
/// read-only connections (WAL lets them read while the writer writes), so
/// a heartbeat or a listing never queues behind a transaction holding the
/// one writer; they see every committed change. Elsewhere (PostgreSQL, an
/// in-memory SQLite): `writer` itself.
pub async fn open_reads(
    url: &str,
    writer: &DatabaseConnection,
) -> Result<DatabaseConnection, DbOpenError> {
    let Some(file) = sqlite_file(url) else {
        return Ok(writer.clone());
    };
    let mut opts = ConnectOptions::new(format!("sqlite://{}?mode=ro", file.display()));
    opts.max_connections(SQLITE_READERS)
        .min_connections(1)
        .connect_timeout(Duration::from_secs(10))
        .acquire_timeout(Duration::from_secs(10))
        .sqlx_logging(false);
    Database::connect(opts).await.map_err(DbOpenError::Connect)
}

/// Size and idle connections of the pool, for `/metrics`.
pub fn pool_stats(db: &DatabaseConnection) -> (u32, u32) {
    match db.get_database_backend() {
        DatabaseBackend::Sqlite => {
            let p = db.get_sqlite_connection_pool();
            (p.size(), p.num_idle() as u32)
        }
        DatabaseBackend::Postgres => {
            let p = db.get_postgres_connection_pool();
            (p.size(), p.num_idle() as u32)
        }
        _ => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_of_a_sqlite_url() {
        assert_eq!(
            sqlite_file("sqlite:///var/lib/kumo/kumo.db?mode=rwc"),
            Some("/var/lib/kumo/kumo.db".into())
        );
        assert_eq!(sqlite_file("sqlite:kumo.db"), Some("kumo.db".into()));
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://db/kumo"), None);
    }
}

#[cfg(test)]
mod read_snapshots {
    use super::*;
    use sea_orm::{EntityTrait, QuerySelect};

    /// A read connection sees what the writer committed before the read
    /// began, whatever it read before.
    #[tokio::test]
    async fn read_connections_see_the_latest_commit() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("k.db").display());
        let writer = open(&url).await.unwrap();
        let reads = open_reads(&url, &writer).await.unwrap();
        let mut stale = 0;
        for i in 0..50 {
            writer
                .execute_unprepared(&format!(
                    "INSERT INTO audit_log (at, actor_name, action, target, source_ip, request_id) VALUES ('2026-01-01T00:00:00Z', 'x', 'y{i}', 'z', '', '')"
                ))
                .await
                .unwrap();
            // One row of many, as `.one()` reads it, then a count.
            let _ = crate::entity::audit_log::Entity::find()
                .limit(1)
                .one(&reads)
                .await
                .unwrap();
            let n = crate::entity::audit_log::Entity::find()
                .all(&reads)
                .await
                .unwrap()
                .len();
            if n != i + 1 {
                stale += 1;
            }
        }
        assert_eq!(stale, 0, "reads behind the writer");
    }
}
