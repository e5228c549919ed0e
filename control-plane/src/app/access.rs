//! Who may do what to a tenant. Admins may do everything; members act
//! according to their role; everyone else is told the tenant does not
//! exist, so that tenant names never leak.

use kumo_api_types::Role;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use uuid::Uuid;

use crate::context::Caller;
use crate::entity::{memberships, tenants};
use crate::error::ApiError;

/// The caller's standing in one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Admin,
    Member(Role),
}

impl Access {
    /// Whether this standing is enough for an action that needs `need`.
    pub fn allows(self, need: Role) -> bool {
        match self {
            Access::Admin => true,
            Access::Member(role) => role >= need,
        }
    }

    /// For actions on a tenant that only platform admins may take.
    pub fn require_admin(self, action: &str) -> Result<(), ApiError> {
        match self {
            Access::Admin => Ok(()),
            Access::Member(_) => Err(ApiError::Forbidden(format!(
                "{action} is for platform administrators"
            ))),
        }
    }

    pub fn require(self, need: Role, action: &str) -> Result<(), ApiError> {
        if self.allows(need) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "{action} needs the {} role in this tenant",
                need.as_str()
            )))
        }
    }
}

pub fn require_admin(caller: &Caller, action: &str) -> Result<(), ApiError> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "{action} is for platform administrators"
        )))
    }
}

/// The tenant named in a path, with the caller's standing in it; `404` when
/// it does not exist or the caller is not a member.
pub async fn tenant_access(
    db: &impl ConnectionTrait,
    caller: &Caller,
    tenant_ref: &str,
) -> Result<(tenants::Model, Access), ApiError> {
    let not_found = || ApiError::not_found(format!("tenant {tenant_ref:?}"));
    let tenant = crate::store::tenancy::find_tenant(db, tenant_ref)
        .await?
        .ok_or_else(not_found)?;
    if caller.is_admin() {
        return Ok((tenant, Access::Admin));
    }
    let membership = memberships::Entity::find_by_id((tenant.id, caller.user.id))
        .one(db)
        .await?
        .ok_or_else(not_found)?;
    Ok((tenant, Access::Member(stored_role(&membership.role)?)))
}

/// A role read back from the database; anything else there is a bug, not bad input.
pub fn stored_role(role: &str) -> Result<Role, ApiError> {
    Role::parse(role).ok_or_else(|| ApiError::Internal(format!("stored role {role:?} is unknown")))
}

/// Ids of the tenants the user belongs to, with at least role `need`.
pub async fn tenant_ids_with_role(
    db: &impl ConnectionTrait,
    user_id: Uuid,
    need: Role,
) -> Result<Vec<Uuid>, ApiError> {
    let rows = memberships::Entity::find()
        .filter(memberships::Column::UserId.eq(user_id))
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .filter(|m| Role::parse(&m.role).is_some_and(|r| r >= need))
        .map(|m| m.tenant_id)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_allow_what_is_below_them() {
        let owner = Access::Member(Role::Owner);
        let member = Access::Member(Role::Member);
        let viewer = Access::Member(Role::Viewer);
        assert!(owner.allows(Role::Owner) && owner.allows(Role::Viewer));
        assert!(member.allows(Role::Member) && !member.allows(Role::Owner));
        assert!(viewer.allows(Role::Viewer) && !viewer.allows(Role::Member));
        assert!(Access::Admin.allows(Role::Owner));
        assert!(viewer.require(Role::Member, "x").is_err());
    }
}
