//! Volumes: block devices that outlive VMs, each on one host's storage
//! and the disk of at most one VM there; the tenants' `volume_gib` quota
//! (0 for existing tenants: an administrator grants it); and where a
//! shelved VM's root disk stays (`vms.disk_host_id`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum TenantQuotas {
    Table,
    VolumeGib,
}

#[derive(DeriveIden, Clone, Copy)]
enum Tenants {
    Table,
    Id,
}

#[derive(DeriveIden, Clone, Copy)]
enum Vms {
    Table,
    DiskHostId,
}

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    Id,
}

#[derive(DeriveIden, Clone, Copy)]
enum Volumes {
    Table,
    Id,
    TenantId,
    Name,
    SizeGib,
    State,
    Reason,
    HostId,
    VmId,
    Serial,
    SourceSnapshotId,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum VolumeSnapshots {
    Table,
    Id,
    VolumeId,
    TenantId,
    Name,
    SizeGib,
    State,
    CreatedAt,
}

fn ts(col: impl IntoIden) -> ColumnDef {
    ColumnDef::new(col)
        .timestamp_with_time_zone()
        .not_null()
        .take()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            TenantQuotas::Table,
            vec![ColumnDef::new(TenantQuotas::VolumeGib)
                .big_integer()
                .not_null()
                .default(0)
                .to_owned()],
        )
        .await?;
        crate::add_columns(
            m,
            Vms::Table,
            vec![ColumnDef::new(Vms::DiskHostId).uuid().null().to_owned()],
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Volumes::Table)
                .col(ColumnDef::new(Volumes::Id).uuid().not_null().primary_key())
                .col(ColumnDef::new(Volumes::TenantId).uuid().not_null())
                .col(ColumnDef::new(Volumes::Name).string_len(63).not_null())
                .col(ColumnDef::new(Volumes::SizeGib).big_integer().not_null())
                .col(ColumnDef::new(Volumes::State).string_len(16).not_null())
                .col(ColumnDef::new(Volumes::Reason).text().null())
                .col(ColumnDef::new(Volumes::HostId).uuid().not_null())
                // The VM it is a disk of; VMs keep no foreign key to it, so
                // a VM's deletion detaches it in the VM's transaction.
                .col(ColumnDef::new(Volumes::VmId).uuid().null())
                .col(
                    ColumnDef::new(Volumes::Serial)
                        .string_len(20)
                        .not_null()
                        .unique_key(),
                )
                // Made from this snapshot (which cannot go while it does).
                .col(ColumnDef::new(Volumes::SourceSnapshotId).uuid().null())
                .col(ts(Volumes::CreatedAt))
                .col(ts(Volumes::UpdatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(Volumes::Table, Volumes::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Volumes::Table, Volumes::HostId)
                        .to(Hosts::Table, Hosts::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("volumes_tenant_name")
                .table(Volumes::Table)
                .col(Volumes::TenantId)
                .col(Volumes::Name)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("volumes_host")
                .table(Volumes::Table)
                .col(Volumes::HostId)
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(VolumeSnapshots::Table)
                .col(
                    ColumnDef::new(VolumeSnapshots::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(VolumeSnapshots::VolumeId).uuid().not_null())
                .col(ColumnDef::new(VolumeSnapshots::TenantId).uuid().not_null())
                .col(
                    ColumnDef::new(VolumeSnapshots::Name)
                        .string_len(63)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(VolumeSnapshots::SizeGib)
                        .big_integer()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(VolumeSnapshots::State)
                        .string_len(16)
                        .not_null(),
                )
                .col(ts(VolumeSnapshots::CreatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(VolumeSnapshots::Table, VolumeSnapshots::VolumeId)
                        .to(Volumes::Table, Volumes::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("volume_snapshots_name")
                .table(VolumeSnapshots::Table)
                .col(VolumeSnapshots::VolumeId)
                .col(VolumeSnapshots::Name)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("volumes_vm")
                .table(Volumes::Table)
                .col(Volumes::VmId)
                .to_owned(),
        )
        .await?;
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(VolumeSnapshots::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(Volumes::Table).to_owned())
            .await?;
        crate::drop_columns(m, Vms::Table, &[Vms::DiskHostId]).await?;
        crate::drop_columns(m, TenantQuotas::Table, &[TenantQuotas::VolumeGib]).await
    }
}
