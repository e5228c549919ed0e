//! User credentials that end with what made them: a portal session opened
//! with an API token names it (and ends with it), a token names the token
//! that minted it (and is revoked with it), and a user can be disabled.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Sessions {
    Table,
    TokenId,
}

#[derive(DeriveIden, Clone, Copy)]
enum ApiTokens {
    Table,
    MintedBy,
}

#[derive(DeriveIden, Clone, Copy)]
enum Users {
    Table,
    Disabled,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Sessions::Table,
            vec![ColumnDef::new(Sessions::TokenId).uuid().null().to_owned()],
        )
        .await?;
        crate::add_columns(
            m,
            ApiTokens::Table,
            vec![ColumnDef::new(ApiTokens::MintedBy).uuid().null().to_owned()],
        )
        .await?;
        crate::add_columns(
            m,
            Users::Table,
            vec![ColumnDef::new(Users::Disabled)
                .boolean()
                .not_null()
                .default(false)
                .to_owned()],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(m, Users::Table, &[Users::Disabled]).await?;
        crate::drop_columns(m, ApiTokens::Table, &[ApiTokens::MintedBy]).await?;
        crate::drop_columns(m, Sessions::Table, &[Sessions::TokenId]).await
    }
}
