//! Argument pieces that several commands share: `--tenant` (with
//! `KUMO_TENANT`), durations like `90d`, and what one VM is made of (for
//! `vm create` and each member of a `cluster create`) with its value parsers.
//! Resource modules take these from here, never from [`crate::commands`].

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use kumo_api_types::{NetworkRequest, ReclaimAction, ServiceLevel, VmCreate};

#[derive(Args, Debug)]
pub struct TenantArg {
    /// Tenant name or id.
    #[arg(long, short = 't', env = "KUMO_TENANT")]
    pub tenant: String,
}

pub fn parse_duration(s: &str) -> Result<u64, String> {
    let err = || format!("{s:?} is not a duration like 90d, 12h, 30m or 45s");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| err())?;
    let mul = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(err()),
    };
    if n == 0 {
        return Err("a duration must be positive".into());
    }
    n.checked_mul(mul).ok_or_else(err)
}

// What one VM is made of, for `vm create` and each member of a
// `cluster create`. Its doc comment would become their about text: keep
// `//` comments here.
#[derive(Args, Debug)]
pub struct SpecArgs {
    /// GPUs passed through to the VM.
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// The GPU model, e.g. H100-SXM5-80GB [default: any].
    #[arg(long)]
    gpu_model: Option<String>,
    /// Virtual CPUs [default: 8 per GPU, at least 2].
    #[arg(long)]
    vcpus: Option<u32>,
    /// Memory, GiB [default: 48 per GPU, at least 4].
    #[arg(long)]
    memory: Option<u32>,
    /// Root disk, GiB [default: 50].
    #[arg(long)]
    disk: Option<u32>,
    /// The VM image, e.g. ubuntu-24.04 (see kumo template list).
    #[arg(long)]
    template: Option<String>,
    /// Cheaper, and reclaimable when guaranteed capacity is needed.
    #[arg(long)]
    spot: bool,
    /// An OpenSSH public key file; repeat for more.
    #[arg(long)]
    ssh_key: Vec<PathBuf>,
    /// Attach to a segment: `SEGMENT` or `SEGMENT=IP`; repeat for more NICs.
    #[arg(long, value_parser = parse_network)]
    network: Vec<NetworkRequest>,
    /// Attach an available volume (repeat for more): the VM goes on the
    /// volume's host.
    #[arg(long)]
    volume: Vec<String>,
    /// Mount a project share: `NAME[:/PATH][:ro]` (default path
    /// `/mnt/NAME`); repeat for more. Clusters mount it in every member.
    #[arg(long, value_parser = kumo_api_types::ShareMountRequest::parse)]
    share: Vec<kumo_api_types::ShareMountRequest>,
    /// With --spot: `shelve` keeps its disk and volumes when it is
    /// reclaimed (`kumo vm unshelve` brings it back) instead of shutting it
    /// down for good.
    #[arg(long, value_parser = parse_reclaim, requires = "spot")]
    on_reclaim: Option<ReclaimAction>,
    /// What its host lost for good does to it: `wait` (it is `lost`, free
    /// of charge, until the host returns; the default) or `recreate` (made
    /// again on another host from its template, with a fresh root disk).
    #[arg(long, value_parser = parse_host_loss)]
    on_host_loss: Option<kumo_api_types::HostLossAction>,
    /// How long the guest has between a notice and the shutdown (e.g.
    /// 10m, to checkpoint), within the platform's bound: a spot VM's
    /// reclaim notice, and for any VM the least warning a maintenance
    /// window gives it.
    #[arg(long, value_parser = parse_duration)]
    notice: Option<u64>,
    /// When no host has room, wait in the fair queue (`queued`) instead of
    /// being refused: free while waiting; delete to cancel.
    #[arg(long)]
    queue: bool,
    /// Run on the project's reservation of this name (while it is active):
    /// its GPU model, on the hosts it holds.
    #[arg(long, value_name = "NAME")]
    reservation: Option<String>,
}

fn parse_host_loss(s: &str) -> Result<kumo_api_types::HostLossAction, String> {
    match s {
        "wait" => Ok(kumo_api_types::HostLossAction::Wait),
        "recreate" => Ok(kumo_api_types::HostLossAction::Recreate),
        _ => Err(format!("{s:?}: wait or recreate")),
    }
}

fn parse_reclaim(s: &str) -> Result<ReclaimAction, String> {
    match s {
        "shelve" => Ok(ReclaimAction::Shelve),
        "shut-down" | "shutdown" => Ok(ReclaimAction::ShutDown),
        _ => Err(format!("{s:?}: shelve or shut-down")),
    }
}

fn parse_network(s: &str) -> Result<NetworkRequest, String> {
    let (segment, ip) = match s.split_once('=') {
        Some((seg, ip)) => (seg, Some(ip.to_owned())),
        None => (s, None),
    };
    if segment.is_empty() {
        return Err(format!("{s:?}: expected SEGMENT or SEGMENT=IP"));
    }
    Ok(NetworkRequest {
        segment: segment.to_owned(),
        ip,
    })
}

impl SpecArgs {
    pub(crate) fn vm(&self, name: &str) -> anyhow::Result<VmCreate> {
        let mut keys = Vec::new();
        for f in &self.ssh_key {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned),
            );
        }
        Ok(VmCreate {
            name: name.to_owned(),
            gpus: self.gpus,
            gpu_model: self.gpu_model.clone(),
            vcpus: self.vcpus,
            memory_gib: self.memory,
            disk_gib: self.disk,
            template: self.template.clone(),
            service_level: if self.spot {
                ServiceLevel::Spot
            } else {
                ServiceLevel::Guaranteed
            },
            ssh_keys: keys,
            networks: self.network.clone(),
            volumes: self.volume.clone(),
            shares: self.share.clone(),
            on_reclaim: self.on_reclaim,
            on_host_loss: self.on_host_loss,
            notice_seconds: self.notice.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            public_ip: false,
            queue: self.queue,
            reservation: self.reservation.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90d"), Ok(90 * 86_400));
        assert_eq!(parse_duration("12h"), Ok(43_200));
        assert!(parse_duration("12").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("0d").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
