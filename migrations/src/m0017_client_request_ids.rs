//! The server names every request; the id a client sent is kept beside it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum AuditLog {
    Table,
    ClientRequestId,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            AuditLog::Table,
            vec![ColumnDef::new(AuditLog::ClientRequestId)
                .string_len(64)
                .null()
                .to_owned()],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(m, AuditLog::Table, &[AuditLog::ClientRequestId]).await
    }
}
