//! VM images (templates): what a platform admin adds and what the API
//! lists, with the login user and an optional direct kernel boot.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateCreate {
    pub name: String,
    /// Base qcow2 image, as a path on every host.
    pub image_path: String,
    pub os: String,
    pub default_user: String,
    /// Boot this kernel directly (with `initrd_path` and `kernel_cmdline`)
    /// instead of the disk's boot loader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cmdline: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Template {
    pub id: Uuid,
    pub name: String,
    /// The base image's path on the hosts; shown to platform admins only,
    /// like `kernel_path` and `initrd_path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_path: Option<String>,
    pub os: String,
    pub default_user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cmdline: Option<String>,
    pub created_at: DateTime<Utc>,
}
