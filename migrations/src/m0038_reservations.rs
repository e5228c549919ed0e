//! Reservations (issue 42): GPUs of one model held for a tenant over a
//! window, the whole hosts held for each (a host for one reservation at a
//! time), and the reservation a VM runs on.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Reservations {
    Table,
    Id,
    TenantId,
    Name,
    GpuModel,
    Gpus,
    StartsAt,
    EndsAt,
    EndPolicy,
    State,
    Revision,
    HeldGpus,
    Short,
    CreatedAt,
    EndedAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum ReservationHosts {
    Table,
    HostId,
    ReservationId,
}

#[derive(DeriveIden, Clone, Copy)]
enum Tenants {
    Table,
    Id,
}

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    Id,
}

#[derive(DeriveIden, Clone, Copy)]
enum Vms {
    Table,
    ReservationId,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        let at = |c: Reservations| {
            ColumnDef::new(c)
                .timestamp_with_time_zone()
                .not_null()
                .to_owned()
        };
        m.create_table(
            Table::create()
                .table(Reservations::Table)
                .col(
                    ColumnDef::new(Reservations::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(Reservations::TenantId).uuid().not_null())
                .col(ColumnDef::new(Reservations::Name).text().not_null())
                .col(ColumnDef::new(Reservations::GpuModel).text().not_null())
                .col(ColumnDef::new(Reservations::Gpus).big_integer().not_null())
                .col(at(Reservations::StartsAt))
                .col(at(Reservations::EndsAt))
                .col(ColumnDef::new(Reservations::EndPolicy).text().not_null())
                .col(ColumnDef::new(Reservations::State).text().not_null())
                .col(
                    ColumnDef::new(Reservations::Revision)
                        .big_integer()
                        .not_null()
                        .default(0),
                )
                .col(
                    ColumnDef::new(Reservations::HeldGpus)
                        .big_integer()
                        .not_null()
                        .default(0),
                )
                .col(ColumnDef::new(Reservations::Short).text().null())
                .col(at(Reservations::CreatedAt))
                .col(
                    ColumnDef::new(Reservations::EndedAt)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Reservations::Table, Reservations::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("reservations_tenant_name")
                .table(Reservations::Table)
                .col(Reservations::TenantId)
                .col(Reservations::Name)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(ReservationHosts::Table)
                .col(
                    ColumnDef::new(ReservationHosts::HostId)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(ReservationHosts::ReservationId)
                        .uuid()
                        .not_null(),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(ReservationHosts::Table, ReservationHosts::ReservationId)
                        .to(Reservations::Table, Reservations::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(ReservationHosts::Table, ReservationHosts::HostId)
                        .to(Hosts::Table, Hosts::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        crate::add_columns(
            m,
            Vms::Table,
            vec![ColumnDef::new(Vms::ReservationId).uuid().null().to_owned()],
        )
        .await?;
        m.create_index(
            Index::create()
                .name("vms_reservation_id")
                .table(Vms::Table)
                .col(Vms::ReservationId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_index(
            Index::drop()
                .name("vms_reservation_id")
                .table(Vms::Table)
                .to_owned(),
        )
        .await?;
        crate::drop_columns(m, Vms::Table, &[Vms::ReservationId]).await?;
        m.drop_table(Table::drop().table(ReservationHosts::Table).to_owned())
            .await?;
        m.drop_table(Table::drop().table(Reservations::Table).to_owned())
            .await
    }
}
