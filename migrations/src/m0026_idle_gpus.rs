//! Idle GPUs: a project's own idle policy and webhook (`idle_policies`,
//! fields left empty are the platform's; the webhook's address sealed with
//! the server's key), and each GPU VM's idle spell, notices and exemption
//! (`vm_idle`). GPU minutes get an index by minute: the retention purge
//! and the fleet's metrics read them by time, across VMs.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum IdlePolicies {
    Table,
    TenantId,
    UtilizationPct,
    Hours,
    Action,
    WebhookSealed,
    WebhookTarget,
    WebhookLastAt,
    WebhookLastResult,
    SetBy,
    SetAt,
}

#[derive(DeriveIden)]
enum VmIdle {
    Table,
    VmId,
    TenantId,
    IdleSince,
    Notices,
    NoticedAt,
    ExemptUntil,
    ExemptReason,
    ExemptBy,
}

#[derive(DeriveIden)]
enum GpuMinutes {
    Table,
    Minute,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Vms {
    Table,
    Id,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(IdlePolicies::Table)
                .col(
                    ColumnDef::new(IdlePolicies::TenantId)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(IdlePolicies::UtilizationPct).double().null())
                .col(ColumnDef::new(IdlePolicies::Hours).integer().null())
                .col(ColumnDef::new(IdlePolicies::Action).string_len(16).null())
                .col(ColumnDef::new(IdlePolicies::WebhookSealed).text().null())
                .col(
                    ColumnDef::new(IdlePolicies::WebhookTarget)
                        .string_len(300)
                        .null(),
                )
                .col(
                    ColumnDef::new(IdlePolicies::WebhookLastAt)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .col(
                    ColumnDef::new(IdlePolicies::WebhookLastResult)
                        .string_len(300)
                        .null(),
                )
                .col(
                    ColumnDef::new(IdlePolicies::SetBy)
                        .string_len(255)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(IdlePolicies::SetAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(IdlePolicies::Table, IdlePolicies::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(VmIdle::Table)
                .col(ColumnDef::new(VmIdle::VmId).uuid().not_null().primary_key())
                .col(ColumnDef::new(VmIdle::TenantId).uuid().not_null())
                .col(
                    ColumnDef::new(VmIdle::IdleSince)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .col(
                    ColumnDef::new(VmIdle::Notices)
                        .small_integer()
                        .not_null()
                        .default(0),
                )
                .col(
                    ColumnDef::new(VmIdle::NoticedAt)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .col(
                    ColumnDef::new(VmIdle::ExemptUntil)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .col(ColumnDef::new(VmIdle::ExemptReason).string_len(500).null())
                .col(ColumnDef::new(VmIdle::ExemptBy).string_len(255).null())
                .foreign_key(
                    ForeignKey::create()
                        .from(VmIdle::Table, VmIdle::VmId)
                        .to(Vms::Table, Vms::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("gpu_minutes_by_minute")
                .table(GpuMinutes::Table)
                .col(GpuMinutes::Minute)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_index(
            Index::drop()
                .name("gpu_minutes_by_minute")
                .table(GpuMinutes::Table)
                .to_owned(),
        )
        .await?;
        m.drop_table(Table::drop().table(VmIdle::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(IdlePolicies::Table).to_owned())
            .await
    }
}
