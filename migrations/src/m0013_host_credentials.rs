//! Host credentials with a lifecycle: a join token is good for a number of
//! registrations (one unless its creator says otherwise) and counts them;
//! a registered host's name is re-joined only after an administrator
//! allows it (`kumo host rejoin`), which also revokes its credential.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum JoinTokens {
    Table,
    MaxUses,
    Used,
}

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    RejoinAllowed,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // Tokens made before this were reusable; they become single-use,
        // and count as unused.
        crate::add_columns(
            m,
            JoinTokens::Table,
            vec![
                ColumnDef::new(JoinTokens::MaxUses)
                    .integer()
                    .not_null()
                    .default(1)
                    .to_owned(),
                ColumnDef::new(JoinTokens::Used)
                    .integer()
                    .not_null()
                    .default(0)
                    .to_owned(),
            ],
        )
        .await?;
        crate::add_columns(
            m,
            Hosts::Table,
            vec![ColumnDef::new(Hosts::RejoinAllowed)
                .boolean()
                .not_null()
                .default(false)
                .to_owned()],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(m, Hosts::Table, &[Hosts::RejoinAllowed]).await?;
        crate::drop_columns(
            m,
            JoinTokens::Table,
            &[JoinTokens::Used, JoinTokens::MaxUses],
        )
        .await
    }
}
