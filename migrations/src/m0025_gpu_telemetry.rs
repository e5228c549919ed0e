//! What GPU guests say of their GPUs: a row per VM, GPU and minute
//! (`gpu_minutes`, sums and extremes of the readings in it, kept 30 days)
//! and each VM's last word (`vm_telemetry`: ok, or unknown and why).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum GpuMinutes {
    Table,
    VmId,
    HostBdf,
    Minute,
    TenantId,
    Samples,
    UtilN,
    UtilSum,
    UtilMax,
    MemUsedMax,
    MemTotal,
    TempMax,
    PowerN,
    PowerSum,
    EccMax,
    Throttle,
}

#[derive(DeriveIden, Clone, Copy)]
enum VmTelemetry {
    Table,
    VmId,
    TenantId,
    State,
    Reason,
    ReadAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        let int = |c: GpuMinutes| ColumnDef::new(c).integer().not_null().default(0).take();
        let real = |c: GpuMinutes| ColumnDef::new(c).double().null().take();
        let big = |c: GpuMinutes| ColumnDef::new(c).big_integer().null().take();
        m.create_table(
            Table::create()
                .table(GpuMinutes::Table)
                .col(ColumnDef::new(GpuMinutes::VmId).uuid().not_null())
                .col(
                    ColumnDef::new(GpuMinutes::HostBdf)
                        .string_len(16)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(GpuMinutes::Minute)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .col(ColumnDef::new(GpuMinutes::TenantId).uuid().not_null())
                .col(int(GpuMinutes::Samples))
                .col(int(GpuMinutes::UtilN))
                .col(real(GpuMinutes::UtilSum))
                .col(real(GpuMinutes::UtilMax))
                .col(big(GpuMinutes::MemUsedMax))
                .col(big(GpuMinutes::MemTotal))
                .col(real(GpuMinutes::TempMax))
                .col(int(GpuMinutes::PowerN))
                .col(real(GpuMinutes::PowerSum))
                .col(big(GpuMinutes::EccMax))
                .col(big(GpuMinutes::Throttle))
                .primary_key(
                    Index::create()
                        .col(GpuMinutes::VmId)
                        .col(GpuMinutes::HostBdf)
                        .col(GpuMinutes::Minute),
                )
                .to_owned(),
        )
        .await?;
        // Old minutes are purged by time.
        m.create_index(
            Index::create()
                .name("gpu_minutes_minute")
                .table(GpuMinutes::Table)
                .col(GpuMinutes::Minute)
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(VmTelemetry::Table)
                .col(
                    ColumnDef::new(VmTelemetry::VmId)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(VmTelemetry::TenantId).uuid().not_null())
                .col(ColumnDef::new(VmTelemetry::State).string_len(16).not_null())
                .col(ColumnDef::new(VmTelemetry::Reason).text().null())
                .col(
                    ColumnDef::new(VmTelemetry::ReadAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(VmTelemetry::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(GpuMinutes::Table).to_owned())
            .await
    }
}
