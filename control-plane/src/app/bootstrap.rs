//! First start on an empty database: create the platform admin and hand its
//! token to the operator through a 0600 file, never through logs.

use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, DatabaseConnection, EntityTrait, PaginatorTrait, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::auth;
use crate::entity::{api_tokens, users};
use crate::error::is_unique_violation;

pub const ADMIN_USER: &str = "admin";
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("database error during bootstrap: {0}")]
    Db(#[from] sea_orm::DbErr),
    #[error("cannot write the admin token to {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Creates the admin user and token when no user exists yet. Returns the
/// token file's path when it did. Another replica winning the race is fine:
/// the unique user name decides, and the loser does nothing.
pub async fn bootstrap(
    db: &DatabaseConnection,
    data_dir: &Path,
    now: DateTime<Utc>,
) -> Result<Option<PathBuf>, BootstrapError> {
    if users::Entity::find().count(db).await? > 0 {
        return Ok(None);
    }
    let minted = auth::mint();
    let txn = db.begin().await?;
    let user = users::ActiveModel {
        id: Set(Uuid::now_v7()),
        name: Set(ADMIN_USER.into()),
        display_name: Set("Platform administrator".into()),
        email: Set(None),
        kind: Set("local".into()),
        is_admin: Set(true),
        disabled: Set(false),
        created_at: Set(now),
    };
    let user = match user.insert(&txn).await {
        Ok(u) => u,
        Err(e) if is_unique_violation(&e) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    api_tokens::ActiveModel {
        id: Set(minted.id),
        user_id: Set(user.id),
        secret_hash: Set(minted.secret_hash),
        description: Set("bootstrap admin token".into()),
        created_at: Set(now),
        expires_at: Set(None),
        last_used_at: Set(None),
        revoked_at: Set(None),
        minted_by: Set(None),
    }
    .insert(&txn)
    .await?;
    // Write the file before committing: if it cannot be written, no admin
    // exists whose token nobody knows, and the next start tries again.
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    write_secret_file(&path, &minted.token).map_err(|source| BootstrapError::TokenFile {
        path: path.clone(),
        source,
    })?;
    txn.commit().await?;
    Ok(Some(path))
}

fn write_secret_file(path: &Path, secret: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // `mode` applies only to new files; an old file keeps its bits.
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    writeln!(f, "{secret}")?;
    f.sync_all()
}
