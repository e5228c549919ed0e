use sea_orm::entity::prelude::*;

/// An authorization request sent to a provider, waiting for its answer.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "login_flows")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub state: String,
    pub provider: String,
    pub pkce_verifier: String,
    pub nonce: String,
    /// Where to go once logged in (a local path).
    pub next: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
