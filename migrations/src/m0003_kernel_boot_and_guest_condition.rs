//! Templates that boot a kernel and initrd directly, and what a host agent
//! last said about a VM's guest (the NCCL file written, or why not).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Templates {
    Table,
    KernelPath,
    InitrdPath,
    KernelCmdline,
}

#[derive(DeriveIden)]
enum Vms {
    Table,
    GuestCondition,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // SQLite adds one column per ALTER TABLE.
        for col in [
            Templates::KernelPath,
            Templates::InitrdPath,
            Templates::KernelCmdline,
        ] {
            m.alter_table(
                Table::alter()
                    .table(Templates::Table)
                    .add_column(ColumnDef::new(col).string_len(1024).null())
                    .to_owned(),
            )
            .await?;
        }
        m.alter_table(
            Table::alter()
                .table(Vms::Table)
                .add_column(ColumnDef::new(Vms::GuestCondition).text().null())
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Vms::Table)
                .drop_column(Vms::GuestCondition)
                .to_owned(),
        )
        .await?;
        for col in [
            Templates::KernelPath,
            Templates::InitrdPath,
            Templates::KernelCmdline,
        ] {
            m.alter_table(
                Table::alter()
                    .table(Templates::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
