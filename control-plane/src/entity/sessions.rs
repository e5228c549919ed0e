use sea_orm::entity::prelude::*;

/// A browser session: `id` is the hex SHA-256 of the cookie's secret.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "sessions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub user_id: Uuid,
    /// The token every form of this session carries.
    pub csrf: String,
    pub created_at: DateTimeUtc,
    pub last_seen_at: DateTimeUtc,
    /// The OpenID Provider a federated session came from…
    pub provider: Option<String>,
    /// …and its ID token, the hint for RP-initiated logout.
    pub id_token: Option<String>,
    /// The API token a session was opened with: the session ends with it.
    pub token_id: Option<Uuid>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
