//! `kumo login --device`: OAuth device authorization grants under way.
//! The command holds a handle (only its hash is stored); the server holds
//! the provider's device code and polls the provider for it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum DeviceLogins {
    Table,
    Id,
    Provider,
    DeviceCode,
    IntervalSecs,
    CreatedAt,
    ExpiresAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(DeviceLogins::Table)
                .col(
                    ColumnDef::new(DeviceLogins::Id)
                        .string_len(64)
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(DeviceLogins::Provider)
                        .string_len(64)
                        .not_null(),
                )
                .col(ColumnDef::new(DeviceLogins::DeviceCode).text().not_null())
                .col(
                    ColumnDef::new(DeviceLogins::IntervalSecs)
                        .integer()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(DeviceLogins::CreatedAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(DeviceLogins::ExpiresAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(DeviceLogins::Table).to_owned())
            .await
    }
}
