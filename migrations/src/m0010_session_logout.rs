//! What RP-initiated logout needs of a federated session: the provider
//! it came from and the ID token to hint with at the provider's end
//! session endpoint. Empty for sessions begun with an API token.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Sessions {
    Table,
    Provider,
    IdToken,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        m.alter_table(
            Table::alter()
                .table(Sessions::Table)
                .add_column(ColumnDef::new(Sessions::Provider).string_len(64).null())
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Sessions::Table)
                .add_column(ColumnDef::new(Sessions::IdToken).text().null())
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for c in [Sessions::IdToken, Sessions::Provider] {
            m.alter_table(
                Table::alter()
                    .table(Sessions::Table)
                    .drop_column(c)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
