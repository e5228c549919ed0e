//! Lost hosts with a policy (issue 41): when each host became unreachable
//! (its VMs are `lost` once that is longer ago than the platform's limit;
//! what each VM wants done then is in its spec).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    UnreachableSince,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Hosts::Table,
            vec![ColumnDef::new(Hosts::UnreachableSince)
                .timestamp_with_time_zone()
                .null()
                .to_owned()],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(m, Hosts::Table, &[Hosts::UnreachableSince]).await
    }
}
