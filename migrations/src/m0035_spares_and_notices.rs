//! Cluster spares (issue 41): N members' worth of a cluster's shape kept
//! free in its scalable unit (named, with the GPU model the members got),
//! for repairs; and when a host's maintenance window was announced, from
//! which each VM's own notice runs; whether a cluster must keep to one
//! scalable unit (`preferred` or `required`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Clusters {
    Table,
    Spares,
    SpareUnit,
    SpareModel,
    SingleSu,
}

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    MaintenanceToldAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Clusters::Table,
            vec![
                ColumnDef::new(Clusters::Spares)
                    .integer()
                    .not_null()
                    .default(0)
                    .to_owned(),
                ColumnDef::new(Clusters::SpareUnit).text().null().to_owned(),
                ColumnDef::new(Clusters::SingleSu)
                    .string_len(16)
                    .not_null()
                    .default("preferred")
                    .to_owned(),
                ColumnDef::new(Clusters::SpareModel)
                    .text()
                    .null()
                    .to_owned(),
            ],
        )
        .await?;
        crate::add_columns(
            m,
            Hosts::Table,
            vec![ColumnDef::new(Hosts::MaintenanceToldAt)
                .timestamp_with_time_zone()
                .null()
                .to_owned()],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(m, Hosts::Table, &[Hosts::MaintenanceToldAt]).await?;
        crate::drop_columns(
            m,
            Clusters::Table,
            &[
                Clusters::Spares,
                Clusters::SpareUnit,
                Clusters::SpareModel,
                Clusters::SingleSu,
            ],
        )
        .await
    }
}
