//! Metering and points: rate cards (each in force from its time on),
//! metered runs (a resource of a VM while it runs, or its disk while it
//! exists, with how far it has been charged), the charges posted from them
//! (one per run and piece start: posting twice is a key conflict), and
//! point grants; per tenant, when its points ran out and any grace an
//! admin gave, and the budget alerts raised (each once).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum RateCards {
    Table,
    Id,
    EffectiveFrom,
    Prices,
    CreatedAt,
}

#[derive(DeriveIden)]
enum MeterRuns {
    Table,
    Id,
    VmId,
    VmName,
    TenantId,
    Class,
    Quantity,
    Level,
    StartedAt,
    EndedAt,
    PostedUntil,
}

#[derive(DeriveIden)]
enum Charges {
    Table,
    Id,
    RunId,
    TenantId,
    VmId,
    VmName,
    Class,
    Level,
    PeriodFrom,
    PeriodTo,
    Seconds,
    PerHour,
    Amount,
    AmountMicro,
    PostedAt,
}

#[derive(DeriveIden)]
enum TenantBilling {
    Table,
    TenantId,
    ExhaustedSince,
    GraceUntil,
}

#[derive(DeriveIden)]
enum BillingAlerts {
    Table,
    Id,
    TenantId,
    Kind,
    GrantId,
    Message,
    At,
}

#[derive(DeriveIden)]
enum PointGrants {
    Table,
    Id,
    TenantId,
    Amount,
    GrantedAt,
    ExpiresAt,
    Note,
    CreatedAt,
}

fn ts<T: IntoIden>(c: T) -> ColumnDef {
    ColumnDef::new(c)
        .timestamp_with_time_zone()
        .not_null()
        .to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(RateCards::Table)
                .col(
                    ColumnDef::new(RateCards::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ts(RateCards::EffectiveFrom).unique_key().to_owned())
                .col(ColumnDef::new(RateCards::Prices).text().not_null())
                .col(ts(RateCards::CreatedAt))
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(MeterRuns::Table)
                .col(
                    ColumnDef::new(MeterRuns::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(MeterRuns::VmId).uuid().not_null())
                .col(ColumnDef::new(MeterRuns::VmName).string_len(63).not_null())
                .col(ColumnDef::new(MeterRuns::TenantId).uuid().not_null())
                .col(ColumnDef::new(MeterRuns::Class).string_len(80).not_null())
                .col(
                    ColumnDef::new(MeterRuns::Quantity)
                        .string_len(40)
                        .not_null(),
                )
                .col(ColumnDef::new(MeterRuns::Level).string_len(16).not_null())
                .col(ts(MeterRuns::StartedAt))
                .col(
                    ColumnDef::new(MeterRuns::EndedAt)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .col(
                    ColumnDef::new(MeterRuns::PostedUntil)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .to_owned(),
        )
        .await?;
        // A replayed transition cannot open the same run twice.
        m.create_index(
            Index::create()
                .name("meter_runs_vm_class_start_key")
                .table(MeterRuns::Table)
                .col(MeterRuns::VmId)
                .col(MeterRuns::Class)
                .col(MeterRuns::StartedAt)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Charges::Table)
                .col(ColumnDef::new(Charges::Id).uuid().not_null().primary_key())
                .col(ColumnDef::new(Charges::RunId).uuid().not_null())
                .col(ColumnDef::new(Charges::TenantId).uuid().not_null())
                .col(ColumnDef::new(Charges::VmId).uuid().not_null())
                .col(ColumnDef::new(Charges::VmName).string_len(63).not_null())
                .col(ColumnDef::new(Charges::Class).string_len(80).not_null())
                .col(ColumnDef::new(Charges::Level).string_len(16).not_null())
                .col(ts(Charges::PeriodFrom))
                .col(ts(Charges::PeriodTo))
                .col(ColumnDef::new(Charges::Seconds).big_integer().not_null())
                .col(ColumnDef::new(Charges::PerHour).string_len(40).not_null())
                .col(ColumnDef::new(Charges::Amount).string_len(40).not_null())
                // The same amount in millionths (charges have 6 places), so
                // the database can sum a tenant's charges exactly.
                .col(
                    ColumnDef::new(Charges::AmountMicro)
                        .big_integer()
                        .not_null(),
                )
                .col(ts(Charges::PostedAt))
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("charges_run_period_key")
                .table(Charges::Table)
                .col(Charges::RunId)
                .col(Charges::PeriodFrom)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("charges_tenant_period")
                .table(Charges::Table)
                .col(Charges::TenantId)
                .col(Charges::PeriodFrom)
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(PointGrants::Table)
                .col(
                    ColumnDef::new(PointGrants::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(PointGrants::TenantId).uuid().not_null())
                .col(
                    ColumnDef::new(PointGrants::Amount)
                        .string_len(40)
                        .not_null(),
                )
                .col(ts(PointGrants::GrantedAt))
                .col(ts(PointGrants::ExpiresAt))
                .col(ColumnDef::new(PointGrants::Note).string_len(500).null())
                .col(ts(PointGrants::CreatedAt))
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(TenantBilling::Table)
                .col(
                    ColumnDef::new(TenantBilling::TenantId)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(TenantBilling::ExhaustedSince)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .col(
                    ColumnDef::new(TenantBilling::GraceUntil)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(BillingAlerts::Table)
                .col(
                    ColumnDef::new(BillingAlerts::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(BillingAlerts::TenantId).uuid().not_null())
                .col(
                    ColumnDef::new(BillingAlerts::Kind)
                        .string_len(40)
                        .not_null(),
                )
                // What the alert is about (a grant, an exhaustion), so each fires once.
                .col(ColumnDef::new(BillingAlerts::GrantId).uuid().not_null())
                .col(
                    ColumnDef::new(BillingAlerts::Message)
                        .string_len(500)
                        .not_null(),
                )
                .col(ts(BillingAlerts::At))
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("billing_alerts_once_key")
                .table(BillingAlerts::Table)
                .col(BillingAlerts::TenantId)
                .col(BillingAlerts::Kind)
                .col(BillingAlerts::GrantId)
                .unique()
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for t in [
            BillingAlerts::Table.into_iden(),
            TenantBilling::Table.into_iden(),
            PointGrants::Table.into_iden(),
            Charges::Table.into_iden(),
            MeterRuns::Table.into_iden(),
            RateCards::Table.into_iden(),
        ] {
            m.drop_table(Table::drop().table(t).to_owned()).await?;
        }
        Ok(())
    }
}
