//! What each host's agent could not set up: the segments that did not
//! converge there, by VNI, with why (JSON), as its last heartbeat said.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    SegmentFaults,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Hosts::Table,
            vec![ColumnDef::new(Hosts::SegmentFaults)
                .text()
                .null()
                .to_owned()],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(m, Hosts::Table, &[Hosts::SegmentFaults]).await
    }
}
