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
    if body.notice_seconds == Some(0) {
        return Err(ApiError::field("notice_seconds", "at least 1"));
    }
    if body.on_reclaim.is_some() && body.service_level != kumo_api_types::ServiceLevel::Spot {
        return Err(ApiError::field(
            "on_reclaim",
            "only spot VMs are reclaimed: leave it out, or ask for a spot VM",
        ));
    }
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
    for (i, k) in body.ssh_keys.iter().enumerate() {
        ssh_public_key(&format!("ssh_keys[{i}]"), k)?;
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
        on_reclaim: body.on_reclaim.unwrap_or_default(),
        on_host_loss: body.on_host_loss.unwrap_or_default(),
        notice_seconds: body.notice_seconds,
        // Set by the reservation's own check ([`crate::app::reservations::assign`]).
        reservation: None,
    })
}

/// The longest key line taken (an RSA-16384 key is about 2.8 kB).
pub const MAX_SSH_KEY_LEN: usize = 8192;

/// One OpenSSH public key line (`type base64 [comment]`), as it goes into
/// the guest's `authorized_keys` through cloud-init: it must parse as a
/// key of a known type, and no character of it, the comment included, may
/// be a control character (a NUL or newline would cut or add lines there).
pub fn ssh_public_key(field: &str, k: &str) -> Result<(), ApiError> {
    if k.len() > MAX_SSH_KEY_LEN {
        return Err(ApiError::field(
            field,
            format!("at most {MAX_SSH_KEY_LEN} bytes"),
        ));
    }
    if k.chars().any(char::is_control) {
        return Err(ApiError::field(field, "no control characters"));
    }
    ssh_key::PublicKey::from_openssh(k).map_err(|e| {
        ApiError::field(
            field,
            format!("not an OpenSSH public key line ({e}): `ssh-ed25519 AAAA… comment`"),
        )
    })?;
    Ok(())
}

/// A spec as a tenant sees it: the template's name, never where its image
/// or kernel lies on the hosts (paths tell a tenant about the hosts'
/// layout and are the operator's business).
pub fn as_shown(spec: VmSpec) -> VmSpec {
    VmSpec {
        image_path: None,
        kernel: None,
        ..spec
    }
}

#[cfg(test)]
mod tests {
    use super::ssh_public_key;

    const ED25519: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEfKZKAnUydzsiZEOKuPIAY7Nck1wiFzauveaJjZfhrF me@lab";
    const ECDSA: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBL7g8/s88qyrk3uGkDNvsSVxNVouSS+aY6WGW1iDOmqHGeBrZYGvMoOZqPPubt9RZa7RLsVHk+ZZwUb3WZeyE/0= root@vm";

    #[test]
    fn keys_are_parsed_not_guessed() {
        assert!(ssh_public_key("k", ED25519).is_ok());
        assert!(ssh_public_key("k", ECDSA).is_ok());
        for bad in [
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK0 me@lab",
            "ssh-ed25519",
            "not a key",
            "",
            &ED25519.replace("me@lab", "me\0lab"),
            &ED25519.replace("me@lab", "me\nssh-rsa AAAA x"),
            &ED25519.replace("me@lab", "me\u{1b}[2Jlab"),
            &format!("{ED25519}{}", "x".repeat(9000)),
        ] {
            assert!(ssh_public_key("k", bad).is_err(), "{bad:?}");
        }
    }
}
