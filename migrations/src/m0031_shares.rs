//! Project shares (issue 40): a tenant's directories on the filesystem
//! every host mounts (`shares`), which VMs mount with virtiofs
//! (`share_mounts`); the tenants' `share_gib` quota (0 for existing
//! tenants: an administrator grants it); and each host's mount of that
//! filesystem as its agent reports it (`hosts.shares_storage`, JSON).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum TenantQuotas {
    Table,
    ShareGib,
}

#[derive(DeriveIden, Clone, Copy)]
enum Tenants {
    Table,
    Id,
}

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    SharesStorage,
}

#[derive(DeriveIden, Clone, Copy)]
enum Shares {
    Table,
    Id,
    TenantId,
    Name,
    SizeGib,
    State,
    Reason,
    KeeperHostId,
    Project,
    UsedBytes,
    LimitKind,
    ReadOnly,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum ShareMounts {
    Table,
    ShareId,
    VmId,
    Path,
    ReadOnly,
    Tag,
    Condition,
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
            vec![ColumnDef::new(TenantQuotas::ShareGib)
                .big_integer()
                .not_null()
                .default(0)
                .to_owned()],
        )
        .await?;
        crate::add_columns(
            m,
            Hosts::Table,
            vec![ColumnDef::new(Hosts::SharesStorage)
                .text()
                .null()
                .to_owned()],
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Shares::Table)
                .col(ColumnDef::new(Shares::Id).uuid().not_null().primary_key())
                .col(ColumnDef::new(Shares::TenantId).uuid().not_null())
                .col(ColumnDef::new(Shares::Name).string_len(63).not_null())
                .col(ColumnDef::new(Shares::SizeGib).big_integer().not_null())
                .col(ColumnDef::new(Shares::State).string_len(16).not_null())
                .col(ColumnDef::new(Shares::Reason).text().null())
                // The host whose agent makes, grows, measures and deletes
                // its directory (any host sees the filesystem); no foreign
                // key, so a host's removal never waits for shares.
                .col(ColumnDef::new(Shares::KeeperHostId).uuid().null())
                // The filesystem's project id: one per share, fleet-wide.
                .col(
                    ColumnDef::new(Shares::Project)
                        .big_integer()
                        .not_null()
                        .unique_key(),
                )
                .col(ColumnDef::new(Shares::UsedBytes).big_integer().null())
                .col(ColumnDef::new(Shares::LimitKind).string_len(16).null())
                .col(
                    ColumnDef::new(Shares::ReadOnly)
                        .boolean()
                        .not_null()
                        .default(false),
                )
                .col(ts(Shares::CreatedAt))
                .col(ts(Shares::UpdatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(Shares::Table, Shares::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("shares_tenant_name")
                .table(Shares::Table)
                .col(Shares::TenantId)
                .col(Shares::Name)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("shares_keeper")
                .table(Shares::Table)
                .col(Shares::KeeperHostId)
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(ShareMounts::Table)
                .col(ColumnDef::new(ShareMounts::ShareId).uuid().not_null())
                // VMs keep no foreign key to it: a VM's deletion removes
                // its mounts in the VM's transaction.
                .col(ColumnDef::new(ShareMounts::VmId).uuid().not_null())
                .col(ColumnDef::new(ShareMounts::Path).string_len(255).not_null())
                .col(ColumnDef::new(ShareMounts::ReadOnly).boolean().not_null())
                .col(ColumnDef::new(ShareMounts::Tag).string_len(36).not_null())
                // How the mount stands, as the VM's host last said.
                .col(ColumnDef::new(ShareMounts::Condition).text().null())
                .col(ts(ShareMounts::CreatedAt))
                .primary_key(
                    Index::create()
                        .col(ShareMounts::ShareId)
                        .col(ShareMounts::VmId),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(ShareMounts::Table, ShareMounts::ShareId)
                        .to(Shares::Table, Shares::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("share_mounts_vm")
                .table(ShareMounts::Table)
                .col(ShareMounts::VmId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(ShareMounts::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(Shares::Table).to_owned())
            .await?;
        crate::drop_columns(m, Hosts::Table, &[Hosts::SharesStorage]).await?;
        crate::drop_columns(m, TenantQuotas::Table, &[TenantQuotas::ShareGib]).await
    }
}
