//! Consoles across replicas (issue 39): each replica records itself (an
//! address the others reach it at, and when it was last seen); a console's
//! tickets, its agent's dials, its link's home replica and its people's
//! seats are rows, so a person and an agent meet whichever replicas they
//! reach. Only a ticket's SHA-256 is kept.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Replicas {
    Table,
    Id,
    Url,
    SeenAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum ConsoleTickets {
    Table,
    Digest,
    TenantId,
    VmId,
    HostId,
    UserName,
    TokenId,
    SessionId,
    Write,
    ExpiresAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum ConsoleDials {
    Table,
    Session,
    TenantId,
    VmId,
    HostId,
    ReplicaId,
    ExpiresAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum ConsoleLinks {
    Table,
    VmId,
    ReplicaId,
    Since,
}

#[derive(DeriveIden, Clone, Copy)]
enum ConsoleSeats {
    Table,
    Id,
    TenantId,
    ReplicaId,
    OpenedAt,
}

fn at<T: IntoIden>(c: T) -> ColumnDef {
    ColumnDef::new(c)
        .timestamp_with_time_zone()
        .not_null()
        .take()
}

fn uuid<T: IntoIden>(c: T) -> ColumnDef {
    ColumnDef::new(c).uuid().not_null().take()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(Replicas::Table)
                .col(uuid(Replicas::Id).primary_key())
                .col(ColumnDef::new(Replicas::Url).string().not_null())
                .col(at(Replicas::SeenAt))
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(ConsoleTickets::Table)
                .col(
                    ColumnDef::new(ConsoleTickets::Digest)
                        .string_len(64)
                        .not_null()
                        .primary_key(),
                )
                .col(uuid(ConsoleTickets::TenantId))
                .col(uuid(ConsoleTickets::VmId))
                .col(uuid(ConsoleTickets::HostId))
                .col(ColumnDef::new(ConsoleTickets::UserName).string().not_null())
                .col(ColumnDef::new(ConsoleTickets::TokenId).uuid().null())
                .col(ColumnDef::new(ConsoleTickets::SessionId).string().null())
                .col(ColumnDef::new(ConsoleTickets::Write).boolean().not_null())
                .col(at(ConsoleTickets::ExpiresAt))
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("console_tickets_tenant")
                .table(ConsoleTickets::Table)
                .col(ConsoleTickets::TenantId)
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(ConsoleDials::Table)
                .col(uuid(ConsoleDials::Session).primary_key())
                .col(uuid(ConsoleDials::TenantId))
                .col(uuid(ConsoleDials::VmId))
                .col(uuid(ConsoleDials::HostId))
                .col(uuid(ConsoleDials::ReplicaId))
                .col(at(ConsoleDials::ExpiresAt))
                .to_owned(),
        )
        .await?;
        // Every desired state reads its host's dials.
        m.create_index(
            Index::create()
                .name("console_dials_host")
                .table(ConsoleDials::Table)
                .col(ConsoleDials::HostId)
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("console_dials_tenant")
                .table(ConsoleDials::Table)
                .col(ConsoleDials::TenantId)
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(ConsoleLinks::Table)
                .col(uuid(ConsoleLinks::VmId).primary_key())
                .col(uuid(ConsoleLinks::ReplicaId))
                .col(at(ConsoleLinks::Since))
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(ConsoleSeats::Table)
                .col(uuid(ConsoleSeats::Id).primary_key())
                .col(uuid(ConsoleSeats::TenantId))
                .col(uuid(ConsoleSeats::ReplicaId))
                .col(at(ConsoleSeats::OpenedAt))
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("console_seats_tenant")
                .table(ConsoleSeats::Table)
                .col(ConsoleSeats::TenantId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for t in [
            ConsoleSeats::Table.into_iden(),
            ConsoleLinks::Table.into_iden(),
            ConsoleDials::Table.into_iden(),
            ConsoleTickets::Table.into_iden(),
            Replicas::Table.into_iden(),
        ] {
            m.drop_table(Table::drop().table(t).to_owned()).await?;
        }
        Ok(())
    }
}
