//! GPU telemetry older than the minutes' window (`[telemetry]
//! minutes_days`, default 7) kept as hours: `gpu_hours` holds what the
//! minutes of each VM, GPU and hour held (sums and extremes fold).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum GpuHours {
    Table,
    VmId,
    HostBdf,
    Hour,
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

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        let int = |c: GpuHours| ColumnDef::new(c).integer().not_null().default(0).take();
        let real = |c: GpuHours| ColumnDef::new(c).double().null().take();
        let big = |c: GpuHours| ColumnDef::new(c).big_integer().null().take();
        m.create_table(
            Table::create()
                .table(GpuHours::Table)
                .col(ColumnDef::new(GpuHours::VmId).uuid().not_null())
                .col(ColumnDef::new(GpuHours::HostBdf).string_len(16).not_null())
                .col(
                    ColumnDef::new(GpuHours::Hour)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .col(ColumnDef::new(GpuHours::TenantId).uuid().not_null())
                .col(int(GpuHours::Samples))
                .col(int(GpuHours::UtilN))
                .col(real(GpuHours::UtilSum))
                .col(real(GpuHours::UtilMax))
                .col(big(GpuHours::MemUsedMax))
                .col(big(GpuHours::MemTotal))
                .col(real(GpuHours::TempMax))
                .col(int(GpuHours::PowerN))
                .col(real(GpuHours::PowerSum))
                .col(big(GpuHours::EccMax))
                .col(big(GpuHours::Throttle))
                .primary_key(
                    Index::create()
                        .col(GpuHours::VmId)
                        .col(GpuHours::HostBdf)
                        .col(GpuHours::Hour),
                )
                .to_owned(),
        )
        .await?;
        // Old hours are purged by time.
        m.create_index(
            Index::create()
                .name("gpu_hours_hour")
                .table(GpuHours::Table)
                .col(GpuHours::Hour)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(GpuHours::Table).to_owned())
            .await
    }
}
