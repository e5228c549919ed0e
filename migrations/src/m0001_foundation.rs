//! Users, tenants, memberships, API tokens, quotas, the audit log and
//! idempotency records.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
    Name,
    DisplayName,
    Email,
    Kind,
    IsAdmin,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
    Name,
    DisplayName,
    Description,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Memberships {
    Table,
    TenantId,
    UserId,
    Role,
    CreatedAt,
}

#[derive(DeriveIden)]
enum ApiTokens {
    Table,
    Id,
    UserId,
    SecretHash,
    Description,
    CreatedAt,
    ExpiresAt,
    LastUsedAt,
    RevokedAt,
}

#[derive(DeriveIden)]
enum TenantQuotas {
    Table,
    TenantId,
    Vcpus,
    MemoryGib,
    Vms,
    Segments,
    PublicIps,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum TenantGpuQuotas {
    Table,
    TenantId,
    GpuModel,
    Gpus,
}

#[derive(DeriveIden)]
enum AuditLog {
    Table,
    Id,
    At,
    ActorId,
    ActorName,
    Action,
    TenantId,
    TenantName,
    Target,
    SourceIp,
    RequestId,
}

#[derive(DeriveIden)]
enum IdempotencyKeys {
    Table,
    UserId,
    Key,
    RequestHash,
    Status,
    ContentType,
    Body,
    CreatedAt,
    CompletedAt,
}

fn ts(col: impl IntoIden) -> ColumnDef {
    ColumnDef::new(col)
        .timestamp_with_time_zone()
        .not_null()
        .take()
}

fn ts_null(col: impl IntoIden) -> ColumnDef {
    ColumnDef::new(col).timestamp_with_time_zone().null().take()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(Users::Table)
                .col(ColumnDef::new(Users::Id).uuid().not_null().primary_key())
                .col(
                    ColumnDef::new(Users::Name)
                        .string_len(63)
                        .not_null()
                        .unique_key(),
                )
                .col(
                    ColumnDef::new(Users::DisplayName)
                        .string_len(255)
                        .not_null(),
                )
                .col(ColumnDef::new(Users::Email).string_len(255).null())
                .col(ColumnDef::new(Users::Kind).string_len(16).not_null())
                .col(ColumnDef::new(Users::IsAdmin).boolean().not_null())
                .col(ts(Users::CreatedAt))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Tenants::Table)
                .col(ColumnDef::new(Tenants::Id).uuid().not_null().primary_key())
                .col(
                    ColumnDef::new(Tenants::Name)
                        .string_len(63)
                        .not_null()
                        .unique_key(),
                )
                .col(
                    ColumnDef::new(Tenants::DisplayName)
                        .string_len(255)
                        .not_null(),
                )
                .col(ColumnDef::new(Tenants::Description).text().not_null())
                .col(ts(Tenants::CreatedAt))
                .col(ts(Tenants::UpdatedAt))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Memberships::Table)
                .col(ColumnDef::new(Memberships::TenantId).uuid().not_null())
                .col(ColumnDef::new(Memberships::UserId).uuid().not_null())
                .col(ColumnDef::new(Memberships::Role).string_len(16).not_null())
                .col(ts(Memberships::CreatedAt))
                .primary_key(
                    Index::create()
                        .col(Memberships::TenantId)
                        .col(Memberships::UserId),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Memberships::Table, Memberships::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Memberships::Table, Memberships::UserId)
                        .to(Users::Table, Users::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("memberships_by_user")
                .table(Memberships::Table)
                .col(Memberships::UserId)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(ApiTokens::Table)
                .col(
                    ColumnDef::new(ApiTokens::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(ApiTokens::UserId).uuid().not_null())
                .col(
                    ColumnDef::new(ApiTokens::SecretHash)
                        .string_len(64)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(ApiTokens::Description)
                        .string_len(255)
                        .not_null(),
                )
                .col(ts(ApiTokens::CreatedAt))
                .col(ts_null(ApiTokens::ExpiresAt))
                .col(ts_null(ApiTokens::LastUsedAt))
                .col(ts_null(ApiTokens::RevokedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(ApiTokens::Table, ApiTokens::UserId)
                        .to(Users::Table, Users::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("api_tokens_by_user")
                .table(ApiTokens::Table)
                .col(ApiTokens::UserId)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(TenantQuotas::Table)
                .col(
                    ColumnDef::new(TenantQuotas::TenantId)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(TenantQuotas::Vcpus).big_integer().not_null())
                .col(
                    ColumnDef::new(TenantQuotas::MemoryGib)
                        .big_integer()
                        .not_null(),
                )
                .col(ColumnDef::new(TenantQuotas::Vms).big_integer().not_null())
                .col(
                    ColumnDef::new(TenantQuotas::Segments)
                        .big_integer()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(TenantQuotas::PublicIps)
                        .big_integer()
                        .not_null(),
                )
                .col(ts(TenantQuotas::UpdatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(TenantQuotas::Table, TenantQuotas::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(TenantGpuQuotas::Table)
                .col(ColumnDef::new(TenantGpuQuotas::TenantId).uuid().not_null())
                .col(
                    ColumnDef::new(TenantGpuQuotas::GpuModel)
                        .string_len(64)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(TenantGpuQuotas::Gpus)
                        .big_integer()
                        .not_null(),
                )
                .primary_key(
                    Index::create()
                        .col(TenantGpuQuotas::TenantId)
                        .col(TenantGpuQuotas::GpuModel),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(TenantGpuQuotas::Table, TenantGpuQuotas::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;

        // The audit log keeps names as text and has no foreign keys: it must
        // outlive the users and tenants it speaks of.
        m.create_table(
            Table::create()
                .table(AuditLog::Table)
                .col(
                    ColumnDef::new(AuditLog::Id)
                        .big_integer()
                        .not_null()
                        .auto_increment()
                        .primary_key(),
                )
                .col(ts(AuditLog::At))
                .col(ColumnDef::new(AuditLog::ActorId).uuid().null())
                .col(
                    ColumnDef::new(AuditLog::ActorName)
                        .string_len(63)
                        .not_null(),
                )
                .col(ColumnDef::new(AuditLog::Action).string_len(64).not_null())
                .col(ColumnDef::new(AuditLog::TenantId).uuid().null())
                .col(ColumnDef::new(AuditLog::TenantName).string_len(63).null())
                .col(ColumnDef::new(AuditLog::Target).string_len(255).not_null())
                .col(ColumnDef::new(AuditLog::SourceIp).string_len(64).not_null())
                .col(
                    ColumnDef::new(AuditLog::RequestId)
                        .string_len(64)
                        .not_null(),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("audit_log_by_tenant")
                .table(AuditLog::Table)
                .col(AuditLog::TenantId)
                .col(AuditLog::Id)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(IdempotencyKeys::Table)
                .col(ColumnDef::new(IdempotencyKeys::UserId).uuid().not_null())
                .col(
                    ColumnDef::new(IdempotencyKeys::Key)
                        .string_len(255)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(IdempotencyKeys::RequestHash)
                        .string_len(64)
                        .not_null(),
                )
                .col(ColumnDef::new(IdempotencyKeys::Status).integer().null())
                .col(
                    ColumnDef::new(IdempotencyKeys::ContentType)
                        .string_len(128)
                        .null(),
                )
                .col(ColumnDef::new(IdempotencyKeys::Body).text().null())
                .col(ts(IdempotencyKeys::CreatedAt))
                .col(ts_null(IdempotencyKeys::CompletedAt))
                .primary_key(
                    Index::create()
                        .col(IdempotencyKeys::UserId)
                        .col(IdempotencyKeys::Key),
                )
                .to_owned(),
        )
        .await?;
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for t in [
            IdempotencyKeys::Table.into_iden(),
            AuditLog::Table.into_iden(),
            TenantGpuQuotas::Table.into_iden(),
            TenantQuotas::Table.into_iden(),
            ApiTokens::Table.into_iden(),
            Memberships::Table.into_iden(),
            Tenants::Table.into_iden(),
            Users::Table.into_iden(),
        ] {
            m.drop_table(Table::drop().table(t).to_owned()).await?;
        }
        Ok(())
    }
}
