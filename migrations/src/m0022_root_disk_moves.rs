//! Unshelving a VM on another host than the one holding its disks
//! (`kumo vm unshelve --anywhere`): whether its placement may ignore that
//! host (`vms.unshelve_anywhere`), the SHA-256 of the token the new host's
//! agent fetches its root disk with (the token itself stays in that
//! agent's memory), and the root disks that hosts still keep of VMs that
//! now run elsewhere or are gone (`stale_root_disks`), until their agents
//! report them removed.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Vms {
    Table,
    UnshelveAnywhere,
    DiskMoveTokenSha256,
}

#[derive(DeriveIden, Clone, Copy)]
enum StaleRootDisks {
    Table,
    VmId,
    HostId,
    CreatedAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    Id,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Vms::Table,
            vec![
                ColumnDef::new(Vms::UnshelveAnywhere)
                    .boolean()
                    .not_null()
                    .default(false)
                    .to_owned(),
                ColumnDef::new(Vms::DiskMoveTokenSha256)
                    .string_len(64)
                    .null()
                    .to_owned(),
            ],
        )
        .await?;
        // No key to `vms`: the VM may be deleted while its old copy stays.
        m.create_table(
            Table::create()
                .table(StaleRootDisks::Table)
                .col(ColumnDef::new(StaleRootDisks::VmId).uuid().not_null())
                .col(ColumnDef::new(StaleRootDisks::HostId).uuid().not_null())
                .col(
                    ColumnDef::new(StaleRootDisks::CreatedAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .primary_key(
                    Index::create()
                        .col(StaleRootDisks::VmId)
                        .col(StaleRootDisks::HostId),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(StaleRootDisks::Table, StaleRootDisks::HostId)
                        .to(Hosts::Table, Hosts::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("stale_root_disks_host")
                .table(StaleRootDisks::Table)
                .col(StaleRootDisks::HostId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(StaleRootDisks::Table).to_owned())
            .await?;
        crate::drop_columns(
            m,
            Vms::Table,
            &[Vms::UnshelveAnywhere, Vms::DiskMoveTokenSha256],
        )
        .await
    }
}
