//! Backups of the embedded database: an online, consistent copy while the
//! server serves (SQLite's `VACUUM INTO`, one read transaction, so the
//! copy is the database at one moment), checked before it is called
//! done; and a restore into a fresh data directory. PostgreSQL is backed
//! up with its own tools (`pg_dump`; docs/src/operator/backups.md).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};

use crate::db::sqlite_file;

/// What a backup or restore holds, for the operator to check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub file: PathBuf,
    pub tenants: i64,
    pub vms: i64,
    pub audit_entries: i64,
    pub migrations: i64,
}

fn quoted(p: &Path) -> anyhow::Result<String> {
    let s = p
        .to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))?;
    Ok(format!("'{}'", s.replace('\'', "''")))
}

async fn scalar(db: &DatabaseConnection, sql: &str) -> anyhow::Result<i64> {
    let row = db
        .query_one(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .context("no answer")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// Opens a SQLite file read-only and checks it is a whole Kumo database.
async fn check(file: &Path) -> anyhow::Result<Summary> {
    let url = format!("sqlite://{}?mode=ro", file.display());
    let db = Database::connect(&url)
        .await
        .with_context(|| format!("opening {}", file.display()))?;
    let ok = db
        .query_one(Statement::from_string(
            db.get_database_backend(),
            "PRAGMA integrity_check",
        ))
        .await?
        .and_then(|r| r.try_get_by_index::<String>(0).ok());
    if ok.as_deref() != Some("ok") {
        bail!("{} fails SQLite's integrity check: {ok:?}", file.display());
    }
    let summary = Summary {
        file: file.to_path_buf(),
        migrations: scalar(&db, "SELECT COUNT(*) FROM seaql_migrations")
            .await
            .with_context(|| format!("{} is not a Kumo database", file.display()))?,
        tenants: scalar(&db, "SELECT COUNT(*) FROM tenants").await?,
        vms: scalar(&db, "SELECT COUNT(*) FROM vms").await?,
        audit_entries: scalar(&db, "SELECT COUNT(*) FROM audit_log").await?,
    };
    db.close().await?;
    Ok(summary)
}

fn private(file: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} private", file.display()))
}

/// Copies the database at `database_url` to `to` (a new file), while it
/// serves.
pub async fn backup(database_url: &str, to: &Path) -> anyhow::Result<Summary> {
    if sqlite_file(database_url).is_none() {
        bail!("back up PostgreSQL with pg_dump (the manual, docs/src/operator/backups.md); this command copies the embedded SQLite database");
    }
    if to.exists() {
        bail!("{} exists; a backup never overwrites", to.display());
    }
    let db = Database::connect(database_url)
        .await
        .context("opening the database")?;
    db.execute_unprepared(&format!("VACUUM INTO {}", quoted(to)?))
        .await
        .with_context(|| format!("copying to {}", to.display()))?;
    db.close().await?;
    private(to)?;
    check(to).await
}

/// Puts a backup in place of the database at `database_url`, which must
/// not exist yet (a fresh data directory): checked first, copied beside
/// it, then renamed, so a failed restore leaves no half database.
pub async fn restore(from: &Path, database_url: &str) -> anyhow::Result<Summary> {
    let Some(target) = sqlite_file(database_url) else {
        bail!(
            "restore PostgreSQL with pg_restore or psql (the manual, docs/src/operator/backups.md)"
        );
    };
    if target.exists() {
        bail!(
            "{} exists: restore into a fresh data directory (never over a database)",
            target.display()
        );
    }
    check(from).await?;
    let dir = target.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let part = target.with_extension("restoring");
    std::fs::copy(from, &part).with_context(|| format!("copying to {}", part.display()))?;
    private(&part)?;
    std::fs::rename(&part, &target)?;
    check(&target).await
}
