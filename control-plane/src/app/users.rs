//! Users' standing: disabled and enabled by administrators, and their
//! portal sessions ended.

use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set, TransactionTrait};

use crate::app::access::require_admin;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::entity::{sessions, users};
use crate::error::ApiError;

/// Disables (or enables) a user. Disabling ends their sessions in the
/// same transaction; their tokens fail from the next request on, since
/// authentication reads the flag.
pub async fn set_disabled(
    st: &AppState,
    actor: &Actor,
    user: &str,
    disabled: bool,
) -> Result<users::Model, ApiError> {
    require_admin(&actor.caller, "disabling and enabling users")?;
    let txn = st.db.begin().await?;
    let u = crate::store::identity::find(&txn, user)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("user {user:?}")))?;
    if disabled && u.id == actor.caller.user.id {
        return Err(ApiError::Conflict(
            "an administrator cannot disable themself".into(),
        ));
    }
    let mut a: users::ActiveModel = u.clone().into();
    a.disabled = Set(disabled);
    let u = a.update(&txn).await?;
    if disabled {
        sessions::Entity::delete_many()
            .filter(sessions::Column::UserId.eq(u.id))
            .exec(&txn)
            .await?;
    }
    let action = if disabled {
        "user.disable"
    } else {
        "user.enable"
    };
    audit::record(&txn, actor, action, None, &u.name).await?;
    txn.commit().await?;
    Ok(u)
}

/// Ends every portal session of a user (administrators, or the user).
pub async fn end_sessions(st: &AppState, actor: &Actor, user: &str) -> Result<u64, ApiError> {
    let txn = st.db.begin().await?;
    let u = crate::store::identity::find(&txn, user)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("user {user:?}")))?;
    if u.id != actor.caller.user.id {
        require_admin(&actor.caller, "ending another user's sessions")?;
    }
    let ended = sessions::Entity::delete_many()
        .filter(sessions::Column::UserId.eq(u.id))
        .exec(&txn)
        .await?
        .rows_affected;
    audit::record(&txn, actor, "user.sessions.end", None, &u.name).await?;
    txn.commit().await?;
    Ok(ended)
}
