//! Federated login: authorization flows under way (single use, keyed by
//! their `state`), the identities a user logs in with (one user per issuer
//! and subject), and server-side browser sessions (only a hash of the
//! cookie's secret is stored).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum LoginFlows {
    Table,
    State,
    Provider,
    PkceVerifier,
    Nonce,
    Next,
    CreatedAt,
}

#[derive(DeriveIden)]
enum UserIdentities {
    Table,
    Issuer,
    Subject,
    UserId,
    Email,
    Eppn,
    Affiliation,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Sessions {
    Table,
    Id,
    UserId,
    Csrf,
    CreatedAt,
    LastSeenAt,
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
                .table(LoginFlows::Table)
                .col(
                    ColumnDef::new(LoginFlows::State)
                        .string_len(128)
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(LoginFlows::Provider)
                        .string_len(63)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(LoginFlows::PkceVerifier)
                        .string_len(256)
                        .not_null(),
                )
                .col(ColumnDef::new(LoginFlows::Nonce).string_len(256).not_null())
                .col(ColumnDef::new(LoginFlows::Next).string_len(512).not_null())
                .col(ts(LoginFlows::CreatedAt))
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(UserIdentities::Table)
                .col(
                    ColumnDef::new(UserIdentities::Issuer)
                        .string_len(512)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(UserIdentities::Subject)
                        .string_len(255)
                        .not_null(),
                )
                .col(ColumnDef::new(UserIdentities::UserId).uuid().not_null())
                .col(ColumnDef::new(UserIdentities::Email).string_len(320).null())
                .col(ColumnDef::new(UserIdentities::Eppn).string_len(320).null())
                .col(
                    ColumnDef::new(UserIdentities::Affiliation)
                        .string_len(512)
                        .null(),
                )
                .col(ts(UserIdentities::CreatedAt))
                .primary_key(
                    Index::create()
                        .col(UserIdentities::Issuer)
                        .col(UserIdentities::Subject),
                )
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Sessions::Table)
                .col(
                    ColumnDef::new(Sessions::Id)
                        .string_len(64)
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(Sessions::UserId).uuid().not_null())
                .col(ColumnDef::new(Sessions::Csrf).string_len(64).not_null())
                .col(ts(Sessions::CreatedAt))
                .col(ts(Sessions::LastSeenAt))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for t in [
            Sessions::Table.into_iden(),
            UserIdentities::Table.into_iden(),
            LoginFlows::Table.into_iden(),
        ] {
            m.drop_table(Table::drop().table(t).to_owned()).await?;
        }
        Ok(())
    }
}
