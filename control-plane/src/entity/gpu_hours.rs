//! A VM's GPU over an hour, past the minutes' window: its minutes folded.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "gpu_hours")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub vm_id: Uuid,
    #[sea_orm(primary_key, auto_increment = false)]
    pub host_bdf: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub hour: DateTimeUtc,
    pub tenant_id: Uuid,
    /// Readings in the hour.
    pub samples: i32,
    /// Readings with a utilisation, their sum and highest.
    pub util_n: i32,
    pub util_sum: Option<f64>,
    pub util_max: Option<f64>,
    pub mem_used_max: Option<i64>,
    pub mem_total: Option<i64>,
    pub temp_max: Option<f64>,
    pub power_n: i32,
    pub power_sum: Option<f64>,
    pub ecc_max: Option<i64>,
    /// NVML throttle reasons seen (OR of the bitmasks).
    pub throttle: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
