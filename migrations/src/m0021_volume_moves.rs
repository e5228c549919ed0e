//! Moving a volume between hosts: where it is going (`move_to_host_id`),
//! the SHA-256 of the token the destination's agent fetches it with (the
//! token itself never leaves that agent's memory), the host still holding
//! the old copy until its agent removes it (`moved_from_host_id`), and
//! each host's transfer address (`hosts.transfer_url`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Volumes {
    Table,
    MoveToHostId,
    MoveTokenSha256,
    MovedFromHostId,
}

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    TransferUrl,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Volumes::Table,
            vec![
                ColumnDef::new(Volumes::MoveToHostId)
                    .uuid()
                    .null()
                    .to_owned(),
                ColumnDef::new(Volumes::MoveTokenSha256)
                    .string_len(64)
                    .null()
                    .to_owned(),
                ColumnDef::new(Volumes::MovedFromHostId)
                    .uuid()
                    .null()
                    .to_owned(),
            ],
        )
        .await?;
        crate::add_columns(
            m,
            Hosts::Table,
            vec![ColumnDef::new(Hosts::TransferUrl).text().null().to_owned()],
        )
        .await?;
        for (name, col) in [
            ("volumes_move_to", Volumes::MoveToHostId),
            ("volumes_moved_from", Volumes::MovedFromHostId),
        ] {
            m.create_index(
                Index::create()
                    .name(name)
                    .table(Volumes::Table)
                    .col(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for name in ["volumes_move_to", "volumes_moved_from"] {
            m.drop_index(Index::drop().name(name).table(Volumes::Table).to_owned())
                .await?;
        }
        crate::drop_columns(m, Hosts::Table, &[Hosts::TransferUrl]).await?;
        crate::drop_columns(
            m,
            Volumes::Table,
            &[
                Volumes::MoveToHostId,
                Volumes::MoveTokenSha256,
                Volumes::MovedFromHostId,
            ],
        )
        .await
    }
}
