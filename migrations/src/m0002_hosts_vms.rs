//! Hosts and their join tokens, VM templates, VMs, device allocations and
//! VM events.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum JoinTokens {
    Table,
    Id,
    SecretHash,
    Description,
    CreatedAt,
    ExpiresAt,
    RevokedAt,
}

#[derive(DeriveIden)]
enum Hosts {
    Table,
    Id,
    Name,
    State,
    CredentialHash,
    Topology,
    ScalableUnit,
    RegisteredAt,
    LastHeartbeatAt,
    Revision,
    VirtType,
}

#[derive(DeriveIden)]
enum Templates {
    Table,
    Id,
    Name,
    ImagePath,
    Os,
    DefaultUser,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Vms {
    Table,
    Id,
    TenantId,
    Name,
    State,
    Reason,
    HostId,
    Spec,
    Placement,
    DesiredPower,
    PowerGeneration,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Allocations {
    Table,
    HostId,
    Kind,
    Key,
    VmId,
}

#[derive(DeriveIden)]
enum VmEvents {
    Table,
    Id,
    VmId,
    TenantId,
    At,
    Kind,
    Message,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
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
        m.create_table(
            Table::create()
                .table(JoinTokens::Table)
                .col(
                    ColumnDef::new(JoinTokens::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(JoinTokens::SecretHash)
                        .string_len(64)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(JoinTokens::Description)
                        .string_len(255)
                        .not_null(),
                )
                .col(ts(JoinTokens::CreatedAt))
                .col(ts(JoinTokens::ExpiresAt))
                .col(
                    ColumnDef::new(JoinTokens::RevokedAt)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Hosts::Table)
                .col(ColumnDef::new(Hosts::Id).uuid().not_null().primary_key())
                .col(
                    ColumnDef::new(Hosts::Name)
                        .string_len(63)
                        .not_null()
                        .unique_key(),
                )
                .col(ColumnDef::new(Hosts::State).string_len(16).not_null())
                .col(
                    ColumnDef::new(Hosts::CredentialHash)
                        .string_len(64)
                        .not_null(),
                )
                .col(ColumnDef::new(Hosts::Topology).text().not_null())
                .col(ColumnDef::new(Hosts::ScalableUnit).string_len(63).null())
                .col(ts(Hosts::RegisteredAt))
                .col(ts(Hosts::LastHeartbeatAt))
                .col(ColumnDef::new(Hosts::Revision).big_integer().not_null())
                .col(ColumnDef::new(Hosts::VirtType).string_len(8).not_null())
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Templates::Table)
                .col(
                    ColumnDef::new(Templates::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(Templates::Name)
                        .string_len(63)
                        .not_null()
                        .unique_key(),
                )
                .col(
                    ColumnDef::new(Templates::ImagePath)
                        .string_len(1024)
                        .not_null(),
                )
                .col(ColumnDef::new(Templates::Os).string_len(63).not_null())
                .col(
                    ColumnDef::new(Templates::DefaultUser)
                        .string_len(63)
                        .not_null(),
                )
                .col(ts(Templates::CreatedAt))
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Vms::Table)
                .col(ColumnDef::new(Vms::Id).uuid().not_null().primary_key())
                .col(ColumnDef::new(Vms::TenantId).uuid().not_null())
                .col(ColumnDef::new(Vms::Name).string_len(63).not_null())
                .col(ColumnDef::new(Vms::State).string_len(16).not_null())
                .col(ColumnDef::new(Vms::Reason).text().null())
                .col(ColumnDef::new(Vms::HostId).uuid().null())
                .col(ColumnDef::new(Vms::Spec).text().not_null())
                .col(ColumnDef::new(Vms::Placement).text().null())
                .col(ColumnDef::new(Vms::DesiredPower).string_len(8).not_null())
                .col(
                    ColumnDef::new(Vms::PowerGeneration)
                        .big_integer()
                        .not_null(),
                )
                .col(ts(Vms::CreatedAt))
                .col(ts(Vms::UpdatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(Vms::Table, Vms::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Vms::Table, Vms::HostId)
                        .to(Hosts::Table, Hosts::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        // A VM name is unique within its tenant.
        m.create_index(
            Index::create()
                .name("vms_tenant_name")
                .table(Vms::Table)
                .col(Vms::TenantId)
                .col(Vms::Name)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("vms_by_host")
                .table(Vms::Table)
                .col(Vms::HostId)
                .to_owned(),
        )
        .await?;
        // The arbiter of device ownership: a GPU, NIC or CPU of a host has
        // at most one row, hence at most one VM holding it.
        m.create_table(
            Table::create()
                .table(Allocations::Table)
                .col(ColumnDef::new(Allocations::HostId).uuid().not_null())
                .col(ColumnDef::new(Allocations::Kind).string_len(8).not_null())
                .col(ColumnDef::new(Allocations::Key).string_len(64).not_null())
                .col(ColumnDef::new(Allocations::VmId).uuid().not_null())
                .primary_key(
                    Index::create()
                        .col(Allocations::HostId)
                        .col(Allocations::Kind)
                        .col(Allocations::Key),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Allocations::Table, Allocations::VmId)
                        .to(Vms::Table, Vms::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("allocations_by_vm")
                .table(Allocations::Table)
                .col(Allocations::VmId)
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(VmEvents::Table)
                .col(
                    ColumnDef::new(VmEvents::Id)
                        .big_integer()
                        .not_null()
                        .auto_increment()
                        .primary_key(),
                )
                .col(ColumnDef::new(VmEvents::VmId).uuid().not_null())
                .col(ColumnDef::new(VmEvents::TenantId).uuid().not_null())
                .col(ts(VmEvents::At))
                .col(ColumnDef::new(VmEvents::Kind).string_len(32).not_null())
                .col(ColumnDef::new(VmEvents::Message).text().not_null())
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("vm_events_by_tenant")
                .table(VmEvents::Table)
                .col(VmEvents::TenantId)
                .col(VmEvents::Id)
                .to_owned(),
        )
        .await?;
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for t in [
            VmEvents::Table.into_iden(),
            Allocations::Table.into_iden(),
            Vms::Table.into_iden(),
            Templates::Table.into_iden(),
            Hosts::Table.into_iden(),
            JoinTokens::Table.into_iden(),
        ] {
            m.drop_table(Table::drop().table(t).to_owned()).await?;
        }
        Ok(())
    }
}
