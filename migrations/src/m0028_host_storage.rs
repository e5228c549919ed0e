//! A host's storage as its agent reports it (`AgentHeartbeat.storage`):
//! what its pool may hold (its size less the agent's reserve), what is
//! free in it, and the root disks' filesystem when that is another. All
//! nullable: a host whose agent does not report them is not counted.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    DiskCapacityGib,
    DiskFreeGib,
    RootDiskCapacityGib,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Hosts::Table,
            vec![
                ColumnDef::new(Hosts::DiskCapacityGib)
                    .big_integer()
                    .null()
                    .to_owned(),
                ColumnDef::new(Hosts::DiskFreeGib)
                    .big_integer()
                    .null()
                    .to_owned(),
                ColumnDef::new(Hosts::RootDiskCapacityGib)
                    .big_integer()
                    .null()
                    .to_owned(),
            ],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(
            m,
            Hosts::Table,
            &[
                Hosts::DiskCapacityGib,
                Hosts::DiskFreeGib,
                Hosts::RootDiskCapacityGib,
            ],
        )
        .await
    }
}
