use sea_orm::entity::prelude::*;

/// A device authorization grant under way for `kumo login --device`: `id`
/// is the hex SHA-256 of the command's handle.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "device_logins")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub provider: String,
    /// The provider's device code, which only the server sends back.
    pub device_code: String,
    /// How often the provider lets itself be asked.
    pub interval_secs: i32,
    pub created_at: DateTimeUtc,
    pub expires_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
