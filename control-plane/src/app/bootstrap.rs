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

/// A local platform administrator, to insert.
fn administrator(name: &str, now: DateTime<Utc>) -> users::ActiveModel {
    users::ActiveModel {
        id: Set(Uuid::now_v7()),
        name: Set(name.to_owned()),
        display_name: Set("Platform administrator".into()),
        email: Set(None),
        kind: Set("local".into()),
        is_admin: Set(true),
        disabled: Set(false),
        created_at: Set(now),
    }
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
    let user = match administrator(ADMIN_USER, now).insert(&txn).await {
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

/// The file `admin recover` writes unless told another.
pub const RECOVERY_TOKEN_FILE: &str = "recovery-token";
/// How long a break-glass token lives: long enough to mint a proper one.
pub const RECOVERY_TOKEN_HOURS: i64 = 24;

#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("database error: {0}")]
    Db(#[from] sea_orm::DbErr),
    #[error("{0}")]
    Refused(String),
    #[error("cannot write the token to {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Break-glass, for whoever can reach the database (`kumo-server admin
/// recover`): a new token for administrator `name`, valid for
/// [`RECOVERY_TOKEN_HOURS`], written to a 0600 file and never printed;
/// the user is re-enabled if it was disabled, and created (as the
/// platform administrator) if no user of that name exists. Each step is
/// in the audit log. Answers the file's path.
pub async fn recover(
    db: &DatabaseConnection,
    name: &str,
    to: &Path,
    now: DateTime<Utc>,
) -> Result<PathBuf, RecoverError> {
    use sea_orm::{ColumnTrait, QueryFilter};
    let txn = db.begin().await?;
    let who = crate::app::audit::Who {
        name: "kumo-server admin recover".into(),
        source_ip: "local",
        request_id: "",
        client_request_id: None,
        at: now,
        tenant: None,
    };
    let user = match users::Entity::find()
        .filter(users::Column::Name.eq(name))
        .one(&txn)
        .await?
    {
        Some(u) if !u.is_admin => {
            return Err(RecoverError::Refused(format!(
            "user {name:?} is not an administrator; name one who is (break-glass never makes one)"
        )))
        }
        Some(u) if u.disabled => {
            let mut a: users::ActiveModel = u.into();
            a.disabled = Set(false);
            let u = a.update(&txn).await?;
            audit_local(&txn, &who, "user.enable", name).await?;
            u
        }
        Some(u) => u,
        None => {
            let u = administrator(name, now).insert(&txn).await?;
            audit_local(&txn, &who, "user.create", name).await?;
            u
        }
    };
    let minted = auth::mint();
    api_tokens::ActiveModel {
        id: Set(minted.id),
        user_id: Set(user.id),
        secret_hash: Set(minted.secret_hash),
        description: Set("break-glass token (kumo-server admin recover)".into()),
        created_at: Set(now),
        expires_at: Set(Some(now + chrono::Duration::hours(RECOVERY_TOKEN_HOURS))),
        last_used_at: Set(None),
        revoked_at: Set(None),
        minted_by: Set(None),
    }
    .insert(&txn)
    .await?;
    audit_local(
        &txn,
        &who,
        "token.recover",
        &format!("{name}: token {}", minted.id),
    )
    .await?;
    // The file first, as at bootstrap: no token nobody holds.
    write_secret_file(to, &minted.token).map_err(|source| RecoverError::TokenFile {
        path: to.to_path_buf(),
        source,
    })?;
    txn.commit().await?;
    Ok(to.to_path_buf())
}

async fn audit_local(
    txn: &sea_orm::DatabaseTransaction,
    who: &crate::app::audit::Who<'_>,
    action: &str,
    target: &str,
) -> Result<(), RecoverError> {
    crate::app::audit::record_by(txn, who, action, target)
        .await
        .map_err(|e| RecoverError::Refused(format!("audit: {e}")))
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
