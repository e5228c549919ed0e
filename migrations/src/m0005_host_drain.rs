//! An operator's drain of a host, kept apart from its reachability: a
//! drained host that goes silent and comes back is still drained.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Hosts {
    Table,
    Drained,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Hosts::Table)
                .add_column(
                    ColumnDef::new(Hosts::Drained)
                        .boolean()
                        .not_null()
                        .default(false),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Hosts::Table)
                .drop_column(Hosts::Drained)
                .to_owned(),
        )
        .await
    }
}
