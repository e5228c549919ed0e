//! Maintenance with notice (issue 41): a host's scheduled window (when,
//! and why), and VMs moving off a host under maintenance (`evacuating`:
//! shelved, then placed elsewhere with their disks, with the power they
//! had).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    MaintenanceAt,
    MaintenanceReason,
}

#[derive(DeriveIden, Clone, Copy)]
enum Vms {
    Table,
    Evacuating,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Hosts::Table,
            vec![
                ColumnDef::new(Hosts::MaintenanceAt)
                    .timestamp_with_time_zone()
                    .null()
                    .to_owned(),
                ColumnDef::new(Hosts::MaintenanceReason)
                    .text()
                    .null()
                    .to_owned(),
            ],
        )
        .await?;
        crate::add_columns(
            m,
            Vms::Table,
            vec![ColumnDef::new(Vms::Evacuating)
                .string_len(16)
                .null()
                .to_owned()],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(m, Vms::Table, &[Vms::Evacuating]).await?;
        crate::drop_columns(
            m,
            Hosts::Table,
            &[Hosts::MaintenanceAt, Hosts::MaintenanceReason],
        )
        .await
    }
}
