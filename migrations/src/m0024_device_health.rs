//! Each passed-through device's health (`device_health`): its state under
//! the health rules, why, since when, and the counters of the reading the
//! next one is compared with. A row per device a host has reported
//! signals for; it goes with its host.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum DeviceHealth {
    Table,
    HostId,
    Bdf,
    Kind,
    State,
    Reason,
    Since,
    LastFindingAt,
    AerCorrectable,
    AerNonfatal,
    AerFatal,
    CarrierChanges,
    ReadAt,
    Signals,
    ReportedBy,
}

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    Id,
}

fn counter(col: DeviceHealth) -> ColumnDef {
    ColumnDef::new(col).big_integer().null().take()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(DeviceHealth::Table)
                .col(ColumnDef::new(DeviceHealth::HostId).uuid().not_null())
                .col(ColumnDef::new(DeviceHealth::Bdf).string_len(16).not_null())
                .col(ColumnDef::new(DeviceHealth::Kind).string_len(8).not_null())
                .col(
                    ColumnDef::new(DeviceHealth::State)
                        .string_len(16)
                        .not_null(),
                )
                .col(ColumnDef::new(DeviceHealth::Reason).text().null())
                .col(
                    ColumnDef::new(DeviceHealth::Since)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(DeviceHealth::LastFindingAt)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .col(counter(DeviceHealth::AerCorrectable))
                .col(counter(DeviceHealth::AerNonfatal))
                .col(counter(DeviceHealth::AerFatal))
                .col(counter(DeviceHealth::CarrierChanges))
                .col(
                    ColumnDef::new(DeviceHealth::ReadAt)
                        .timestamp_with_time_zone()
                        .null(),
                )
                // The last reading as reported (link, ports, counters), for
                // operators' eyes.
                .col(ColumnDef::new(DeviceHealth::Signals).text().null())
                // The project whose guest's words (an XID) quarantined it:
                // such quarantines are bounded per project and kept out of
                // the fleet's automatic limit.
                .col(ColumnDef::new(DeviceHealth::ReportedBy).uuid().null())
                .primary_key(
                    Index::create()
                        .col(DeviceHealth::HostId)
                        .col(DeviceHealth::Bdf),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(DeviceHealth::Table, DeviceHealth::HostId)
                        .to(Hosts::Table, Hosts::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        // The scheduler reads the devices out of service fleet-wide.
        m.create_index(
            Index::create()
                .name("device_health_state")
                .table(DeviceHealth::Table)
                .col(DeviceHealth::State)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(DeviceHealth::Table).to_owned())
            .await
    }
}
