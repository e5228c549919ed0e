//! A VM request's spec: validated, with defaults filled in.

use kumo_api_types::{VmCreate, VmSpec};

use crate::domain::names;
use crate::error::ApiError;

pub const MAX_GPUS: u32 = 64;

pub const MAX_VCPUS: u32 = 1024;

pub const MAX_MEMORY_GIB: u32 = 16_384;

pub const MAX_DISK_GIB: u32 = 65_536;

pub const MAX_SSH_KEYS: usize = 32;

pub fn validate(body: &VmCreate) -> Result<VmSpec, ApiError> {
    names::tenant_name("name", &body.name)?;
    if body.gpus > MAX_GPUS {
        return Err(ApiError::field("gpus", format!("at most {MAX_GPUS}")));
    }
    if let Some(m) = &body.gpu_model {
        names::gpu_model("gpu_model", m)?;
    }
    let vcpus = body.vcpus_or_default();
    let memory_gib = body.memory_gib_or_default();
    let disk_gib = body.disk_gib.unwrap_or(50);
    for (field, v, max) in [
        ("vcpus", vcpus, MAX_VCPUS),
        ("memory_gib", memory_gib, MAX_MEMORY_GIB),
        ("disk_gib", disk_gib, MAX_DISK_GIB),
    ] {
        if !(1..=max).contains(&v) {
            return Err(ApiError::field(field, format!("between 1 and {max}")));
        }
    }
    if body.ssh_keys.len() > MAX_SSH_KEYS {
        return Err(ApiError::field(
            "ssh_keys",
            format!("at most {MAX_SSH_KEYS}"),
        ));
    }
    for k in &body.ssh_keys {
        let kind = k.split_whitespace().next().unwrap_or("");
        if !(kind.starts_with("ssh-") || kind.starts_with("ecdsa-") || kind.starts_with("sk-"))
            || k.len() > 8192
            || k.contains('\n')
        {
            return Err(ApiError::field(
                "ssh_keys",
                "each key is one OpenSSH public key line",
            ));
        }
    }
    Ok(VmSpec {
        gpus: body.gpus,
        gpu_model: body.gpu_model.clone(),
        vcpus,
        memory_gib,
        disk_gib,
        template: body.template.clone(),
        image_path: None,
        kernel: None,
        service_level: body.service_level,
        ssh_keys: body.ssh_keys.clone(),
    })
}
